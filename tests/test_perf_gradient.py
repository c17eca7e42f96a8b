"""``flowzoo perf``'s reference-style loop (benchmark/perf/measure.py) trains with the released Flow-GRPO gradient, and our
``flow_grpo`` update produces the same gradient on the same rollout whichever way it runs: recompute-free or not,
CFG batched or split. Also: the reference's optimizer step moves the weights exactly as ours does from the same
start, and the saved-activation count sees the kept rollout graphs."""

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from flowzoo.benchmark.perf import measure as perf  # noqa: E402
from flowzoo.errors import ConfigError  # noqa: E402
from tests.test_fidelity_sd3 import model  # noqa: E402,F401  (the module fixture: tiny SD3, LoRA r4)
from tests.test_models_sd3 import sd3_dir  # noqa: E402,F401

SMALL = {"group_size": 2, "num_steps": 4}


@pytest.mark.parametrize("reuse,cfg_batch", [(False, "split"), (False, "batched"), (True, "split"),
                                             (True, "batched"), ("auto", "auto")])
def test_gradient_check_is_tight(model, reuse, cfg_batch):  # noqa: F811
    state = model.trainable_state_dict()
    alg = perf.make_algorithm(model, {**SMALL, "reuse_rollout_graph": reuse, "cfg_batch": cfg_batch})
    assert perf.gradient_check(alg, [perf.PROMPT]) < 1e-5
    after = model.trainable_state_dict()
    assert all(torch.equal(state[k], after[k]) for k in state)  # the check restores the weights


def test_batched_and_split_cfg_give_the_same_velocity_and_gradient(model):  # noqa: F811
    """The released batched form (uncond detached after one 2B call) against the split no_grad form: same v, same
    gradient of a loss through v (1e-5 relative); and the split form makes one more transformer call."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, *model.latent_shape, generator=gen)
    sigma = torch.full((3,), 0.6)
    cond = model.encode(["a photo of a cat", "two red dogs", "a photo of a cat"])
    params = model.trainable_parameters()
    state = model.trainable_state_dict()
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)  # LoRA B is zero at init: make the gradient non-trivial
    calls, results = [], {}
    plain = model.transformer.forward
    model.transformer.forward = lambda *a, **k: calls.append(1) or plain(*a, **k)
    try:
        for mode in ("batched", "split"):
            calls.clear()
            v = model.velocity(x, sigma, cond, 4.5, cfg_grad="cond", cfg_batch=mode)
            grads = torch.autograd.grad((v * torch.linspace(-1, 1, v.numel()).reshape(v.shape)).sum(), params)
            results[mode] = (v.detach(), torch.cat([g.flatten() for g in grads]), len(calls))
    finally:
        del model.transformer.forward
        model.load_trainable_state_dict(state)
    (vb, gb, nb), (vs, gs, ns) = results["batched"], results["split"]
    assert (nb, ns) == (1, 2)
    torch.testing.assert_close(vb, vs, rtol=1e-5, atol=1e-6)
    assert float((gb - gs).norm() / gs.norm()) < 1e-5 and float(gs.norm()) > 0


def test_activation_count_sees_the_kept_graphs(model):  # noqa: F811
    """Kept rollout graphs of the T - 1 = 3 trained steps hold about 3x one recomputed timestep's activations."""
    held = perf.activation_peaks(perf.make_algorithm(model, {**SMALL, "cfg_batch": "batched"}), [perf.PROMPT])
    recomputed = perf.activation_peaks(
        perf.make_algorithm(model, {**SMALL, "cfg_batch": "batched", "reuse_rollout_graph": False}), [perf.PROMPT])
    assert held["reference"] == pytest.approx(recomputed["reference"])  # the same released loop
    assert recomputed["ours"] == pytest.approx(held["reference"], rel=0.1)  # one 2B-row timestep each
    assert held["ours"] == pytest.approx(3 * recomputed["ours"], rel=0.1)


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


def test_unsupported_settings_are_config_errors(model):  # noqa: F811
    with pytest.raises(ConfigError, match="cfg_grad 'both'"):
        perf.make_algorithm(model, {**SMALL, "cfg_grad": "both"})
    with pytest.raises(ConfigError, match="minibatches 1.*got 1, 2"):
        perf.gradient_check(perf.make_algorithm(model, {**SMALL, "minibatches": 2}), [perf.PROMPT])
    with pytest.raises(ConfigError, match="'reuse' is not key=value"):
        perf.parse_overrides(["reuse"])
