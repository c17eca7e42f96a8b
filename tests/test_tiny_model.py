"""The tiny FlowModel on a tiny random config: shapes, CFG, LoRA targets, reference, weights file, one Flow-GRPO
step, and a pretraining run that resumes exactly."""

import pytest
import torch

from flowzoo import algorithms
from flowzoo import models
from flowzoo.errors import ConfigError
from flowzoo.models.diffusers_common import SD3_LORA_TARGETS
from flowzoo.models.tiny import read_weights, save_weights
from flowzoo.models.tiny_data import prompt_set
from flowzoo.rewards.base import Reward, RewardOutput

#: the attention projections without the ``attn.`` prefix
BARE = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")
SMALL = dict(layers=2, heads=2, head_dim=8, text_width=16, text_layers=1, text_heads=2)


@pytest.fixture
def model():
    return models.get("tiny")(weights=None, arch=SMALL, lora_rank=2, lora_alpha=4)


class Brightness(Reward):
    """Dense test reward: mean pixel value (gives non-zero advantages on a random model)."""

    name = "brightness"

    def score(self, samples, prompts, metadata):
        return RewardOutput(samples.float().mean(dim=(1, 2, 3)))


def test_shapes_and_decode_range(model):
    prompts = ["a red circle", "two blue squares"]
    cond = model.encode(prompts)
    x = torch.randn(2, *model.latent_shape)
    v = model.velocity(x, torch.full((2,), 0.5), cond, guidance=1.0)
    assert model.latent_shape == (3, 32, 32) and v.shape == x.shape and torch.isfinite(v).all()
    assert cond.tensors["prompt_embeds"].shape == (2, 12, 16) and cond.tensors["pooled_prompt_embeds"].shape == (2, 16)
    images = model.decode(torch.linspace(-2, 2, 2 * 3 * 32 * 32).view(2, 3, 32, 32))
    assert images.min() == 0 and images.max() == 1
    glyphs = models.get("tiny")(data="glyphs", weights=None, arch=SMALL, lora_rank=2)
    assert glyphs.latent_shape == (3, 16, 48)
    x = torch.randn(1, 3, 16, 48)
    assert glyphs.velocity(x, torch.ones(1), glyphs.encode(['the text "AB3"']), 2.0).shape == x.shape


def test_cfg_combines_conditional_and_unconditional_passes(model):
    cond = model.encode(["a red circle"] * 2)
    x, sigma = torch.randn(2, *model.latent_shape), torch.tensor([0.9, 0.3])
    with torch.no_grad():
        v_cond = model.predict(x, sigma, cond)
        v_uncond = model.predict(x, sigma, model.null_condition(2))
        model.nfe = 0
        guided = model.velocity(x, sigma, cond, guidance=3.0)
    assert model.nfe == 4
    assert torch.allclose(guided, v_uncond + 3.0 * (v_cond - v_uncond), atol=1e-5)
    assert not torch.allclose(v_cond, v_uncond)  # the prompt matters


def test_lora_only_on_sd3_projection_names(model):
    lora_names = [n for n, _ in model.transformer.named_parameters() if "lora_" in n]
    wrapped = {n.split(".lora_")[0] for n in lora_names}
    assert {next(t for t in SD3_LORA_TARGETS if w.endswith(t)) for w in wrapped} == set(SD3_LORA_TARGETS)
    # no dual attention here: the ``attn.`` prefix leaves no attention projection out (the tiny numerics unchanged)
    projections = [n for n, _ in model.transformer.named_modules() if n.endswith(tuple("." + t for t in BARE))]
    assert sorted(projections) == sorted(wrapped)
    trainable = {id(p) for p in model.trainable_parameters()}
    assert trainable == {id(p) for n, p in model.transformer.named_parameters() if "lora_" in n}
    assert all(not p.requires_grad for p in model.text_encoder.parameters())
    assert all(p.requires_grad == ("lora_" in n) for n, p in model.transformer.named_parameters())


def test_reference_is_the_base_until_the_adapter_moves(model):
    cond = model.encode(["a red circle"])
    x, sigma = torch.randn(1, *model.latent_shape), torch.tensor([0.7])
    with torch.no_grad():
        policy = model.predict(x, sigma, cond)
        with model.reference():
            base = model.predict(x, sigma, cond)
        assert torch.equal(policy, base)
        for p in model.trainable_parameters():
            p.add_(0.05)
        moved = model.predict(x, sigma, cond)
        with model.reference():
            assert torch.equal(model.predict(x, sigma, cond), base)
    assert not torch.allclose(moved, base)
    assert all(p.requires_grad for p in model.trainable_parameters())


def test_unknown_words_and_missing_weights_are_config_errors(model, tmp_path):
    with pytest.raises(ConfigError, match="vocabulary"):
        model.encode(["a purple hexagon"])
    with pytest.raises(ConfigError, match="does not exist"):
        models.get("tiny")(weights=str(tmp_path / "none.safetensors"))


def test_weights_file_round_trip(model, tmp_path):
    path = tmp_path / "w.safetensors"
    save_weights(path, model.arch, model.transformer, model.text_encoder, {"pretrain": {"steps_done": 3}})
    arch, _, info = read_weights(path)
    assert arch == model.arch and info == {"pretrain": {"steps_done": 3}}
    loaded = models.get("tiny")(weights=str(path), lora_rank=2, lora_alpha=4, seed=5)
    cond = model.encode(["two green triangles"])
    x, sigma = torch.randn(1, *model.latent_shape), torch.tensor([0.4])
    with torch.no_grad(), model.reference(), loaded.reference():
        assert torch.allclose(model.predict(x, sigma, cond), loaded.predict(x, sigma, loaded.encode(["two green triangles"])))
    with pytest.raises(ConfigError, match="not 'glyphs'"):
        models.get("tiny")(data="glyphs", weights=str(path))


def test_one_flow_grpo_step_is_on_policy_with_finite_loss(model):
    prompts = prompt_set("shapes", 2, seed=1)
    before = [p.detach().clone() for p in model.trainable_parameters()]
    alg = algorithms.get("flow_grpo")(model, Brightness(), {"group_size": 4, "num_steps": 4, "lr": 1e-3}, seed=0)
    stats = alg.step([p for p, _ in prompts], [m for _, m in prompts])
    assert torch.isfinite(torch.tensor([stats.loss, stats.grad_norm])).all()
    assert stats.ratio_mean == pytest.approx(1.0, abs=1e-5) and stats.clip_frac == 0.0
    assert stats.grad_norm > 0 and stats.reward_std > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.trainable_parameters()))


def test_pretraining_resumes_exactly(tmp_path):
    from flowzoo.models.tiny_pretrain import pretrain

    common = dict(batch=4, arch=SMALL, threads=None, progress=False, warmup=2)
    straight = pretrain("shapes", out=tmp_path / "a.safetensors", run_dir=tmp_path / "a", steps=4, **common)
    pretrain("shapes", out=tmp_path / "b.safetensors", run_dir=tmp_path / "b", steps=2, **common)
    resumed = pretrain("shapes", out=tmp_path / "b.safetensors", run_dir=tmp_path / "b", steps=4, **common)
    _, a, info_a = read_weights(straight)
    _, b, info_b = read_weights(resumed)
    assert info_a["pretrain"]["steps_done"] == info_b["pretrain"]["steps_done"] == 4
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    _, fresh, _ = read_weights(pretrain("shapes", out=tmp_path / "c.safetensors", run_dir=tmp_path / "c", steps=1, **common))
    assert any(not torch.equal(a[k], fresh[k]) for k in a)  # training changed the weights


def test_pretrain_command_writes_weights_and_record(tmp_path, capsys):
    import json

    from flowzoo.benchmark.cli import main

    out, run_dir = tmp_path / "w.safetensors", tmp_path / "run"
    assert main(["pretrain", "tiny", "--data", "glyphs", "--steps", "1", "--batch", "2", "--threads", "1",
                 "--out", str(out), "--run-dir", str(run_dir), "--quiet"]) == 0
    record = json.loads((run_dir / "pretrain.json").read_text())
    assert record["steps_done"] == 1 and record["settings"]["data"] == "glyphs"
    assert "--data glyphs" in record["command"]
    assert models.get("tiny")(data="glyphs", weights=str(out)).latent_shape == (3, 16, 48)


def test_shipped_tiny_config_trains_end_to_end_and_logs_eval_components(tmp_path):
    """``benchmark/configs/tiny_flow_grpo.yaml`` on the shipped weights, cut to one small step and 8 eval prompts:
    the update reuses the rollout's graph (no training forward) and the evaluation logs strict accuracy."""
    import pandas as pd

    from flowzoo.benchmark.cli import main

    assert main(["train", "benchmark/configs/tiny_flow_grpo.yaml", "--quiet", f"run_dir={tmp_path}", "train.steps=1",
                 "train.prompts_per_step=1", "train.eval_prompts=8", "train.save_samples=false"]) == 0
    metrics = pd.read_csv(tmp_path / "metrics.csv")
    assert list(metrics["step"]) == [0, 1] and metrics["nfe_training"].iloc[1] == 0
    strict, score = metrics["eval/strict_accuracy"], metrics["eval_reward"]
    assert strict.notna().all() and ((strict >= 0) & (strict <= score + 1e-9)).all()  # strict pass => score 1
