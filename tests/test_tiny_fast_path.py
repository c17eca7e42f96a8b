"""The tiny tier's no-grad fast path (model arg ``no_grad_path``, docs/tiny.md "Speed"): calls made without autograd
run a peft-free copy of the transformer with the LoRA merged into its weights. Same samples, log-probs, losses and
gradients as the peft path, the copy refreshed whenever the LoRA moved, the reference still the base model.

``no_grad_path: compiled`` (the same copy under torch.compile) is not compiled here: one compile takes ~5 s a batch
shape on this CPU; ``tests/test_bench_tiny.py`` measures it (``--benchmark-only``).
"""

import pytest
import torch

from flowzoo import algorithms
from flowzoo import models
from flowzoo.errors import ConfigError
from flowzoo.models.tiny_data import prompt_set
from flowzoo.rewards.shapes import ShapesGenEval

ARCH = {"layers": 2}  # a small random tiny transformer: the paths' math does not depend on its size
PROMPTS = prompt_set("shapes", 2, seed=1)
TEXTS, METADATA = [p for p, _ in PROMPTS], [m for _, m in PROMPTS]


def _model(path: str):
    return models.get("tiny")(weights=None, arch=ARCH, no_grad_path=path)


def _perturb(model, seed: int = 0) -> None:
    """One Adam step on seeded random gradients: peft's gaussian init has B = 0, so the merged delta starts at 0."""
    gen = torch.Generator().manual_seed(seed)
    params = model.trainable_parameters()
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    torch.optim.Adam(params, lr=0.05).step()
    for p in params:
        p.grad = None


def _algorithm(path: str, **config):
    model = _model(path)
    _perturb(model)
    return algorithms.get("flow_grpo")(model, ShapesGenEval(), {
        "group_size": 2, "num_steps": 4, "kl_beta": 0.0, "timestep_fraction": 0.5, "lr": 1e-3, **config})


def _velocity(model, n: int = 4) -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn((n, *model.latent_shape), generator=gen)
    with torch.no_grad():
        return model.velocity(x, torch.full((n,), 0.6), model.encode(["a red circle"] * n), 4.5)


def test_rollout_matches_the_peft_path():
    peft, merged = _algorithm("peft"), _algorithm("merged")
    a, b = peft.fresh_rollout(TEXTS, METADATA), merged.fresh_rollout(TEXTS, METADATA)
    assert merged.model._plain.refreshes == 1 and getattr(peft.model, "_plain", None) is None
    torch.testing.assert_close(b.latents, a.latents, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b.log_probs, a.log_probs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("reuse", [True, False])
def test_step_loss_and_gradient_match_the_peft_path(reuse):
    peft, merged = _algorithm("peft", reuse_rollout_graph=reuse), _algorithm("merged", reuse_rollout_graph=reuse)
    for _ in range(2):  # the second step samples with the LoRA the first one moved (a refresh in between)
        a, b = peft.step(TEXTS, METADATA), merged.step(TEXTS, METADATA)
        assert b.reward_mean == pytest.approx(a.reward_mean, abs=1e-6)
        assert b.loss == pytest.approx(a.loss, rel=1e-3, abs=1e-7)
        assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-3)
    for p, q in zip(peft.model.trainable_parameters(), merged.model.trainable_parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-6)
    assert merged.model._plain.refreshes == 2  # once per optimizer step, not per call


def test_merged_weights_refresh_after_every_write():
    model, peft = _model("merged"), _model("peft")
    _perturb(model), _perturb(peft)
    torch.testing.assert_close(_velocity(model), _velocity(peft), rtol=1e-4, atol=1e-4)
    before = _velocity(model)
    _perturb(model, seed=1), _perturb(peft, seed=1)  # an optimizer step
    after = _velocity(model)
    assert (after - before).abs().max() > 1e-3
    torch.testing.assert_close(after, _velocity(peft), rtol=1e-4, atol=1e-4)
    state = {k: v + 0.1 for k, v in model.trainable_state_dict().items()}
    model.load_trainable_state_dict(state), peft.load_trainable_state_dict(state)
    loaded = _velocity(model)
    assert (loaded - after).abs().max() > 1e-3
    torch.testing.assert_close(loaded, _velocity(peft), rtol=1e-4, atol=1e-4)
    # the peft model's own weights are never merged into
    assert not any(layer.merged for layer in model.transformer.modules() if hasattr(layer, "merged"))


def test_reference_is_the_base_model():
    model, peft = _model("merged"), _model("peft")
    _perturb(model), _perturb(peft)
    policy = _velocity(model)
    with model.reference(), peft.reference():
        reference = _velocity(model)
        torch.testing.assert_close(reference, _velocity(peft), rtol=0, atol=1e-6)  # base weights: no merge
    assert (reference - policy).abs().max() > 1e-3
    torch.testing.assert_close(_velocity(model), policy)  # back to the merged weights after the context
    assert all(p.requires_grad for p in model.trainable_parameters())


def test_gradient_calls_take_the_peft_path():
    model = _model("merged")
    assert model.network() is model.transformer  # autograd on
    with torch.no_grad():
        assert model.network() is model._plain.module
    assert "lora_" not in " ".join(n for n, _ in model._plain.module.named_parameters())


def test_bad_no_grad_path_is_refused():
    with pytest.raises(ConfigError, match="no_grad_path 'fast'.*peft, merged, compiled"):
        models.get("tiny")(weights=None, no_grad_path="fast")


def test_no_grad_path_is_not_part_of_a_runs_identity():
    """Same samples to float rounding: a run made with another no_grad_path (or before it existed) is the same run."""
    from flowzoo.benchmark.run.checkpoints import run_identity

    before = {"model": {"name": "tiny", "args": {"data": "shapes"}}, "train": {"steps": 2}}
    for path in ("peft", "merged", "compiled"):
        assert run_identity({**before, "model": {"name": "tiny", "args": {"data": "shapes", "no_grad_path": path}}},
                            set()) == run_identity(before, set())
    other_data = {**before, "model": {"name": "tiny", "args": {"data": "glyphs"}}}
    assert run_identity(other_data, set()) != run_identity(before, set())
