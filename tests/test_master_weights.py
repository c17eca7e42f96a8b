"""Full fine-tuning of a half-precision base keeps float32 master weights (``master_weights: float32``, the default of
the diffusers adapters): an AdamW step at the released full-fine-tuning rate 1e-5 leaves most bf16 weights unchanged,
because the update is below half a bf16 ulp of the weight; the float32 copy takes every update. ``master_weights:
model`` trains the base's own dtype (a recipe citing a release that does so)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from flowzoo.benchmark.perf.pipeline import MAX_SEQ, RESOLUTION, build_tiny_sd3  # noqa: E402
from flowzoo.errors import ConfigError  # noqa: E402
from flowzoo.models.sd3 import SD3Model  # noqa: E402


def _adamw_step(weights: torch.Tensor, lr: float) -> torch.Tensor:
    """One AdamW step (weight decay 1e-4, the released value) on ``weights`` with a fixed random gradient."""
    param = torch.nn.Parameter(weights.clone())
    param.grad = torch.randn(weights.shape, generator=torch.Generator().manual_seed(1)).to(weights.dtype)
    torch.optim.AdamW([param], lr=lr, weight_decay=1e-4).step()
    return param.detach()


def test_at_lr_1e_5_most_bf16_updates_round_away_and_float32_keeps_them():
    # weights of a transformer's linear layers: around 0.02 in size
    weights = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 0.02
    half = weights.to(torch.bfloat16)
    kept = (_adamw_step(half, 1e-5) == half).float().mean().item()
    assert kept > 0.8  # Adam's first step moves each weight by ~lr; a bf16 ulp of 0.02 is ~1.2e-4
    master = half.float()  # the float32 master copy of the same weights
    assert (_adamw_step(master, 1e-5) != master).all()
    assert (_adamw_step(half, 1e-3) == half).float().mean().item() < 0.2  # at LoRA rates bf16 steps mostly land


@pytest.fixture(scope="module")
def sd3_dir(tmp_path_factory):
    return build_tiny_sd3(tmp_path_factory.mktemp("tiny_sd3_master"), tmp_path_factory.mktemp("tok"))


def _full(sd3_dir, **args):
    return SD3Model(path=sd3_dir, resolution=RESOLUTION, max_sequence_length=MAX_SEQ, dtype="bfloat16", device="cpu",
                    finetune="full", **args)


def test_full_fine_tuning_of_a_bf16_base_trains_float32_weights_and_keeps_a_bf16_reference(sd3_dir):
    model = _full(sd3_dir)
    assert {p.dtype for p in model.trainable_parameters()} == {torch.float32}
    with model.reference():
        assert {p.dtype for p in model.transformer.parameters()} == {torch.bfloat16}
    x = model.initial_noise([torch.Generator().manual_seed(3)])
    sigma, cond = torch.tensor([0.5]), model.encode(["a photo of a cat"])
    with torch.no_grad():
        policy = model.predict(x, sigma, cond)
        with model.reference():
            reference = model.predict(x, sigma, cond)
    torch.testing.assert_close(policy, reference, atol=0, rtol=0)  # the float32 copy holds the bf16 values exactly
    params = model.trainable_parameters()
    before = [p.detach().clone() for p in params]
    model.predict(x, sigma, cond).square().mean().backward()
    torch.optim.AdamW(params, lr=1e-5).step()
    moved = sum(int((p.detach() != b).sum()) for p, b in zip(params, before) if p.grad is not None)
    total = sum(p.numel() for p in params if p.grad is not None)
    assert moved > 0.9 * total  # every weight with a gradient moves
    own = _full(sd3_dir, master_weights="model")
    assert {p.dtype for p in own.trainable_parameters()} == {torch.bfloat16}
    with pytest.raises(ConfigError, match="sd3 master_weights must be one of float32, model, got 'fp8'"):
        _full(sd3_dir, master_weights="fp8")
