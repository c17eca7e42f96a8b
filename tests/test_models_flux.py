"""The flux adapter on a tiny random FluxPipeline (FLUX.1 layout: CLIP + T5, FluxTransformer2DModel with the
guidance embedding, packed 2 x 2 latents) built in code, saved and loaded through the adapter's real
``from_pretrained`` path: exact against the pipeline, every algorithm trains one step on it."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from flowzoo import models  # noqa: E402
from flowzoo.algorithms.engine.sde import sigma_schedule  # noqa: E402
from flowzoo.errors import ConfigError  # noqa: E402
from flowzoo.models.flux import FLUX_DANCE_GRPO_LORA_TARGETS, FLUX_LORA_TARGETS, FluxModel, pipeline_shift  # noqa: E402
from tests.adapter_training import EVERY_ALGORITHM  # noqa: E402
from tests.tiny_pipelines import FLUX_MAX_SEQ, FLUX_RESOLUTION, build_tiny_flux  # noqa: E402

PROMPTS = ["a photo of a cat", "two red dogs"]
ARGS = dict(resolution=FLUX_RESOLUTION, max_sequence_length=FLUX_MAX_SEQ, lora_rank=4, lora_alpha=8, device="cpu")


@pytest.fixture(scope="session")
def flux_dir(tmp_path_factory):
    return build_tiny_flux(tmp_path_factory.mktemp("tiny_flux"), tmp_path_factory.mktemp("flux_tok"))


@pytest.fixture(scope="module")
def model(flux_dir):
    return FluxModel(path=flux_dir, **ARGS)


@pytest.fixture(scope="module")
def pipe(flux_dir):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(flux_dir)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_registered_with_the_pipelines_schedule(model):
    assert models.get("flux") is FluxModel and model.sample_kind == "image" and model.default_sigma_grid == "flux"
    # 16 packed tokens: mu = 0.5 + (1.15 - 0.5) / 3840 * (16 - 256), FLUX.1-dev's calculate_shift line
    assert model.default_shift == pytest.approx(math.exp(0.5 + 0.65 / 3840 * (16 - 256)), rel=1e-12)
    assert model.latent_shape == (16, 16)  # (8/2)^2 patches of 4 x 4 channels


@pytest.mark.parametrize("true_cfg", [1.0, 3.0])
def test_ode_sampling_and_decode_reproduce_the_pipeline(model, pipe, true_cfg):
    steps = 3
    x1 = model.initial_noise([torch.Generator().manual_seed(s) for s in (1, 2)])
    kwargs = dict(prompt=PROMPTS, height=FLUX_RESOLUTION, width=FLUX_RESOLUTION, num_inference_steps=steps,
                  guidance_scale=3.5, max_sequence_length=FLUX_MAX_SEQ)
    if true_cfg != 1.0:  # the pipeline's true CFG against the negative prompt = the zoo's guidance
        kwargs.update(negative_prompt=["", ""], true_cfg_scale=true_cfg)
    expected = pipe(latents=x1.clone(), output_type="latent", **kwargs).images
    sigmas = sigma_schedule(steps, model.default_shift, grid=model.default_sigma_grid)
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas, atol=1e-6, rtol=0)  # the schedule it just used
    cond, x, nfe = model.encode(PROMPTS), x1, model.nfe
    with torch.no_grad():
        for s, s_next in zip(sigmas[:-1], sigmas[1:]):
            x = x + model.velocity(x, torch.full((2,), float(s)), cond, true_cfg) * (s_next - s)
    assert model.nfe - nfe == steps * 2 * (2 if true_cfg != 1.0 else 1)
    assert (x - x1).abs().max() > 1e-2
    torch.testing.assert_close(x, expected, atol=1e-5, rtol=0)
    if true_cfg != 1.0:
        images = pipe(latents=x1.clone(), output_type="pt", **kwargs).images
        decoded = model.decode(x)
        assert decoded.shape == (2, 3, FLUX_RESOLUTION, FLUX_RESOLUTION) and 0 <= decoded.min() <= decoded.max() <= 1
        torch.testing.assert_close(decoded, images, atol=1e-5, rtol=0)


def test_distilled_guidance_is_the_transformer_input(flux_dir, model):
    other = FluxModel(path=flux_dir, distilled_guidance=1.0, **ARGS)
    x = model.initial_noise([torch.Generator().manual_seed(3)])
    sigma, cond = torch.tensor([0.6]), model.encode(PROMPTS[:1])
    with torch.no_grad():
        assert (model.predict(x, sigma, cond) - other.predict(x, sigma, cond)).abs().max() > 1e-4


def test_encode_matches_the_pipeline_and_is_cached(model, pipe, monkeypatch):
    first = model.encode(["a blue cat"])
    embeds, pooled, _ = pipe.encode_prompt("a blue cat", None, max_sequence_length=FLUX_MAX_SEQ)
    torch.testing.assert_close(first.tensors["prompt_embeds"], embeds)
    torch.testing.assert_close(first.tensors["pooled_prompt_embeds"], pooled)
    null, null_pooled, _ = pipe.encode_prompt("", None, max_sequence_length=FLUX_MAX_SEQ)
    torch.testing.assert_close(model.null_condition(2).tensors["prompt_embeds"][1:], null)
    torch.testing.assert_close(model.null_condition(2).tensors["pooled_prompt_embeds"][1:], null_pooled)

    def boom(*args, **kwargs):
        raise AssertionError("text encoder ran for a cached prompt")

    monkeypatch.setattr(model.pipe.text_encoder_2, "forward", boom)
    assert torch.equal(model.encode(["a blue cat"]).tensors["prompt_embeds"], first.tensors["prompt_embeds"])
    with pytest.raises(AssertionError, match="text encoder ran"):
        model.encode(["not cached yet"])


def test_lora_on_the_released_targets_and_reference_is_the_base(model, restore_lora):
    wrapped = {n.split(".lora_")[0] for n, _ in model.transformer.named_parameters() if "lora_" in n}
    assert all(n.endswith(tuple("." + t for t in FLUX_LORA_TARGETS)) for n in wrapped)
    assert any(n.startswith("single_transformer_blocks.") for n in wrapped)  # attn.to_q of the single blocks
    assert any(".ff_context.net.2" in n for n in wrapped)
    assert not any(p.requires_grad for n, p in model.transformer.named_parameters() if "lora_" not in n)
    for name in ("vae", "text_encoder", "text_encoder_2"):
        assert not any(p.requires_grad for p in getattr(model.pipe, name).parameters())
    x = model.initial_noise([torch.Generator().manual_seed(5)])
    sigma, cond = torch.tensor([0.5]), model.encode(PROMPTS[:1])
    base = model.predict(x, sigma, cond)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(torch.randn_like(p) * 0.05)
    trained = model.predict(x, sigma, cond)
    trained.square().mean().backward()
    assert all(p.grad is not None for p in model.trainable_parameters())
    assert all(p.grad is None for n, p in model.transformer.named_parameters() if "lora_" not in n)
    for p in model.trainable_parameters():
        p.grad = None
    assert (trained - base).abs().max() > 1e-4
    with model.reference():
        assert torch.equal(model.predict(x, sigma, cond), base)


def test_lora_init_kaiming_is_peft_default_as_dance_grpo_and_starts_at_the_base(flux_dir):
    """lora_init: kaiming (DanceGRPO's FLUX LoraConfig(init_lora_weights=True)): A Kaiming-uniform, bounded by
    sqrt(6 / ((1 + 5) fan_in)) = 1 / sqrt(fan_in), where gaussian draws A ~ N(0, 1/r) with no bound; B = 0 both ways,
    so the model starts as the base."""
    for init, bounded in (("kaiming", True), ("gaussian", False)):
        built = FluxModel(path=flux_dir, **ARGS, lora_init=init)
        a = [p.detach() for n, p in built.transformer.named_parameters() if "lora_A" in n]
        b = [p.detach() for n, p in built.transformer.named_parameters() if "lora_B" in n]
        assert a and b and not any(p.any() for p in b)
        assert all(bool((p.abs() <= 1 / math.sqrt(p.shape[1]) + 1e-6).all()) for p in a) == bounded
        x = built.initial_noise([torch.Generator().manual_seed(3)])
        sigma, cond = torch.tensor([0.5]), built.encode(PROMPTS[:1])
        with torch.no_grad():
            policy = built.predict(x, sigma, cond)
            with built.reference():
                torch.testing.assert_close(built.predict(x, sigma, cond), policy, atol=0, rtol=0)
    with pytest.raises(ConfigError, match="flux lora_init must be one of gaussian, kaiming, got 'zeros'"):
        FluxModel(path=flux_dir, **ARGS, lora_init="zeros")


def timesteps_seen(model, monkeypatch) -> list:
    """The timestep tensor of every call of ``model``'s transformer class, as they are made."""
    seen = []
    original = type(model.transformer).forward

    def spy(self, *args, **kwargs):
        seen.append(kwargs["timestep"].clone())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(model.transformer), "forward", spy)
    return seen


def test_integer_timesteps_feed_the_releases_truncated_thousandths(flux_dir, model, monkeypatch):
    """integer_timesteps (DanceGRPO's and MixGRPO's FLUX trainers): the transformer sees int(1000 sigma) / 1000."""
    truncated = FluxModel(path=flux_dir, **ARGS, integer_timesteps=True)
    seen = timesteps_seen(truncated, monkeypatch)
    x = truncated.initial_noise([torch.Generator().manual_seed(3)] * 2)
    cond = truncated.encode(PROMPTS)
    with torch.no_grad():
        truncated.predict(x, torch.tensor([0.96013, 0.00893]), cond)
        model.predict(x, torch.tensor([0.96013, 0.00893]), model.encode(PROMPTS))
    torch.testing.assert_close(seen[0], torch.tensor([0.960, 0.008]))
    torch.testing.assert_close(seen[1], torch.tensor([0.96013, 0.00893]))
    with pytest.raises(ConfigError, match="flux integer_timesteps must be true or false, got 'yes'"):
        FluxModel(path=flux_dir, **ARGS, integer_timesteps="yes")


@pytest.mark.parametrize("steps", [10, 12, 20, 25])
def test_integer_timesteps_on_the_linspace_grid_are_the_releases(flux_dir, monkeypatch, steps):
    """On DanceGRPO's / MixGRPO's grid (linspace, shift 3) the transformer sees the release's timesteps: the grid built
    in float32 (torch.linspace, sd3_time_shift) and int(sigma * 1000) of each step (XueZeyue/DanceGRPO
    fastvideo/train_grpo_flux.py:311-313,231 and :506 at 15cc71d). At T 12 step 8 that is 599 (600 from a float64
    grid cast to float32)."""
    truncated = FluxModel(path=flux_dir, **ARGS, integer_timesteps=True)
    seen = timesteps_seen(truncated, monkeypatch)
    t = torch.linspace(1, 0, steps + 1)  # the release's own computation, float32
    released = [int(sigma * 1000) for sigma in (3.0 * t) / (1 + 2.0 * t)][:steps]
    grid = sigma_schedule(steps, 3.0, grid="linspace")[:steps]
    x = truncated.initial_noise([torch.Generator().manual_seed(3)] * steps)
    with torch.no_grad():
        truncated.predict(x, grid, truncated.encode(PROMPTS[:1] * steps))
    assert torch.round(seen[0].double() * 1000).long().tolist() == released
    if steps == 12:
        assert released[8] == 599


def test_the_transformer_runs_without_cudnn_attention_and_the_flags_come_back(model, monkeypatch):
    """FLUX's transformer call leaves cuDNN's attention out (its backward failed at FLUX.1-dev's 720 px shapes on an
    H200: docs/perf.md), and only for that call: the process's backend flags are as before afterwards."""
    seen = []
    original = type(model.transformer).forward

    def spy(self, *args, **kwargs):
        seen.append((torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled(),
                     torch.backends.cuda.math_sdp_enabled()))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(model.transformer), "forward", spy)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    x = model.initial_noise([torch.Generator().manual_seed(3)] * 2)
    with torch.no_grad():
        model.predict(x, torch.tensor([0.9, 0.5]), model.encode(PROMPTS))
    assert seen == [(False, True, True)]
    assert torch.backends.cuda.cudnn_sdp_enabled() == before


def test_gradient_checkpointing_recomputes_without_cudnn_attention_too(flux_dir, monkeypatch):
    """With gradient checkpointing (paper-flux-hpsv2 sets it) the blocks' forward runs again inside the backward pass,
    after predict's context has ended: the recomputation leaves cuDNN attention out as well."""
    checkpointed = FluxModel(path=flux_dir, **ARGS, gradient_checkpointing=True)
    checkpointed.transformer.train()  # diffusers checkpoints only in training mode
    seen = []
    block = checkpointed.transformer.transformer_blocks[0]
    block.register_forward_pre_hook(lambda module, args: seen.append(torch.backends.cuda.cudnn_sdp_enabled()))
    x = checkpointed.initial_noise([torch.Generator().manual_seed(3)] * 2)
    out = checkpointed.predict(x, torch.tensor([0.9, 0.5]), checkpointed.encode(PROMPTS))
    assert seen == [False]
    out.square().mean().backward()
    assert seen == [False, False]  # the forward, then its recomputation in the backward pass


def test_dance_grpo_targets_skip_the_text_stream(flux_dir):
    dance = FluxModel(path=flux_dir, lora_targets=list(FLUX_DANCE_GRPO_LORA_TARGETS), **ARGS)
    wrapped = {n.split(".lora_")[0] for n, _ in dance.transformer.named_parameters() if "lora_" in n}
    assert wrapped and not [n for n in wrapped if "add_" in n or ".ff" in n]
    # double block: q, k, v, out; single block: q, k, v (no to_out there)
    assert len(wrapped) == 4 + 3


def test_bad_options_name_the_value(flux_dir, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"resolution must be a positive multiple of 4.*got 18"):
        FluxModel(path=flux_dir, resolution=18)
    with pytest.raises(ConfigError, match="distilled_guidance .* got -1.0"):
        FluxModel(path=flux_dir, distilled_guidance=-1)
    monkeypatch.delenv("FLOWZOO_FLUX_PATH", raising=False)
    with pytest.raises(ConfigError, match="FLOWZOO_FLUX_PATH"):
        FluxModel()
    with pytest.raises(ConfigError, match="nowhere"):
        FluxModel(path=tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="time_shift_type 'cubic'; known: exponential, linear"):
        pipeline_shift({"use_dynamic_shifting": True, "time_shift_type": "cubic"}, 256)


@pytest.mark.parametrize("algorithm", EVERY_ALGORITHM)
def test_every_algorithm_trains_a_step(model, restore_lora, algorithm):
    from tests.adapter_training import check_training

    check_training(model, algorithm)
