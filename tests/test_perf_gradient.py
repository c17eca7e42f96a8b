"""``flowzoo perf``'s reference-style loop (benchmark/perf.py) trains with the released Flow-GRPO gradient, and our
``flow_grpo`` update produces the same gradient on the same rollout, with and without the recompute-free update.
Also: the reference's optimizer step moves the weights exactly as ours does from the same start."""

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from benchmark import perf  # noqa: E402
from flowzoo.errors import ConfigError  # noqa: E402
from tests.test_fidelity_sd3 import model  # noqa: E402,F401  (the module fixture: tiny SD3, LoRA r4)
from tests.test_models_sd3 import sd3_dir  # noqa: E402,F401

SMALL = {"group_size": 2, "num_steps": 4}


@pytest.mark.parametrize("reuse", [False, True])
def test_gradient_check_is_tight(model, reuse):  # noqa: F811
    state = model.trainable_state_dict()
    alg = perf.make_algorithm(model, {**SMALL, "reuse_rollout_graph": reuse})
    assert perf.gradient_check(alg, [perf.PROMPT]) < 1e-5
    after = model.trainable_state_dict()
    assert all(torch.equal(state[k], after[k]) for k in state)  # the check restores the weights


def test_reference_step_matches_our_step(model):  # noqa: F811
    """Same seed, same start: one reference iteration and one of ours end at the same LoRA weights (1e-5)."""
    state = model.trainable_state_dict()
    try:
        alg = perf.make_algorithm(model, SMALL, seed=3)
        phases = perf.reference_step(alg, [perf.PROMPT])
        assert set(phases) == {"sampling", "reward", "training"} and min(phases.values()) >= 0
        ref = {k: v.clone() for k, v in model.trainable_state_dict().items()}
        model.load_trainable_state_dict(state)
        perf.make_algorithm(model, SMALL, seed=3).step([perf.PROMPT])
        ours = model.trainable_state_dict()
        moved = sum(float((ref[k] - state[k]).norm()) for k in state)
        assert moved > 0
        assert sum(float((ref[k] - ours[k]).norm()) for k in state) < 1e-5 * moved
    finally:
        model.load_trainable_state_dict(state)


@pytest.mark.parametrize("bad", [{"guidance": 7.0}, {"cfg_grad": "both"}])
def test_unsupported_settings_are_config_errors(model, bad):  # noqa: F811
    with pytest.raises(ConfigError, match=str(next(iter(bad.values())))):
        perf.make_algorithm(model, {**SMALL, **bad})
