"""The sd3 adapter on a tiny random StableDiffusion3Pipeline built in code (like diffusers' own
``get_dummy_components``), saved to disk and loaded through the adapter's real ``from_pretrained`` path."""

from __future__ import annotations

import shutil

import pytest
import torch

from flowzoo.algorithms.engine.sde import sigma_schedule

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from flowzoo.errors import ConfigError  # noqa: E402
from flowzoo import models  # noqa: E402
from flowzoo.models.base import Condition  # noqa: E402
from flowzoo.models.sd3 import SD3Model  # noqa: E402

from flowzoo.benchmark.perf.pipeline import MAX_SEQ, RESOLUTION, build_tiny_sd3  # noqa: E402,F401  (shared with flowzoo perf)
PROMPTS = ["a photo of a cat", "two red dogs"]
# the released SD3 trainers' list (Flow-GRPO scripts/train_sd3.py:419-433); the adapter's default
TARGETS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj",
           "attn.add_v_proj", "attn.to_add_out")


@pytest.fixture(scope="session")
def sd3_dir(tmp_path_factory):
    return build_tiny_sd3(tmp_path_factory.mktemp("tiny_sd3"), tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def model(sd3_dir):
    return SD3Model(path=sd3_dir, resolution=RESOLUTION, max_sequence_length=MAX_SEQ, lora_rank=4, lora_alpha=8,
                    device="cpu")


@pytest.fixture(scope="module")
def pipe(sd3_dir):
    from diffusers import StableDiffusion3Pipeline

    pipe = StableDiffusion3Pipeline.from_pretrained(sd3_dir)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def euler_sample(model, x, cond, sigmas, guidance):
    for s, s_next in zip(sigmas[:-1], sigmas[1:]):
        sigma = torch.full((x.shape[0],), float(s))
        x = x + model.velocity(x, sigma, cond, guidance) * (s_next - s)
    return x


def test_registered():
    assert models.get("sd3") is SD3Model


@pytest.mark.parametrize("guidance", [4.5, 1.0])
def test_ode_sampling_reproduces_the_pipeline(model, pipe, guidance):
    steps = 3
    x1 = model.initial_noise([torch.Generator().manual_seed(s) for s in (1, 2)])
    assert x1.shape == (2, *model.latent_shape) == (2, 4, RESOLUTION // 2, RESOLUTION // 2)
    expected = pipe(
        prompt=PROMPTS, height=RESOLUTION, width=RESOLUTION, num_inference_steps=steps, guidance_scale=guidance,
        latents=x1.clone(), output_type="latent", max_sequence_length=MAX_SEQ,
    ).images
    sigmas = sigma_schedule(steps, model.default_shift)  # the schedule the pipeline's scheduler uses
    assert torch.equal(sigmas, pipe.scheduler.sigmas)  # the schedule the pipeline just used
    nfe = model.nfe
    x0 = euler_sample(model, x1, model.encode(PROMPTS), sigmas, guidance)
    assert model.nfe - nfe == steps * 2 * (2 if guidance != 1.0 else 1)
    assert (x0 - x1).abs().max() > 1e-2  # the loop did something
    torch.testing.assert_close(x0, expected, atol=1e-4, rtol=0)

    if guidance != 1.0:  # decode matches the pipeline's own decoding of the same latents
        images = pipe(
            prompt=PROMPTS, height=RESOLUTION, width=RESOLUTION, num_inference_steps=steps,
            guidance_scale=guidance, latents=x1.clone(), output_type="pt", max_sequence_length=MAX_SEQ,
        ).images
        decoded = model.decode(x0)
        assert decoded.shape == (2, 3, RESOLUTION, RESOLUTION) and decoded.dtype == torch.float32
        assert decoded.min() >= 0 and decoded.max() <= 1
        torch.testing.assert_close(decoded, images, atol=1e-4, rtol=0)


def test_guidance_changes_the_velocity(model):
    x = model.initial_noise([torch.Generator().manual_seed(3)] * 2)
    sigma = torch.tensor([0.7, 0.7])
    cond = model.encode(PROMPTS)
    v1 = model.velocity(x, sigma, cond, guidance=1.0)
    v45 = model.velocity(x, sigma, cond, guidance=4.5)
    torch.testing.assert_close(v1, model.predict(x, sigma, cond))
    v_null = model.predict(x, sigma, model.null_condition(2))
    torch.testing.assert_close(v45, v_null + 4.5 * (v1 - v_null), atol=1e-5, rtol=1e-5)
    assert (v1 - v45).abs().max() > 1e-3


def test_encode_cache_reuses_embeddings_without_running_encoders(model, pipe, monkeypatch):
    first = model.encode(["a blue cat"])
    direct = pipe.encode_prompt("a blue cat", None, None, do_classifier_free_guidance=False,
                                max_sequence_length=MAX_SEQ)
    torch.testing.assert_close(first.tensors["prompt_embeds"], direct[0])
    torch.testing.assert_close(first.tensors["pooled_prompt_embeds"], direct[2])
    assert first.tensors["prompt_embeds"].shape == (1, 16 + MAX_SEQ, 32)

    def boom(*args, **kwargs):
        raise AssertionError("text encoder ran for a cached prompt")

    for name in ("text_encoder", "text_encoder_2", "text_encoder_3"):
        monkeypatch.setattr(getattr(model.pipe, name), "forward", boom)
    again = model.encode(["a blue cat", "a blue cat"])
    assert len(again) == 2
    for key, value in first.tensors.items():
        assert torch.equal(again.tensors[key][0], value[0]) and torch.equal(again.tensors[key][1], value[0])
    with pytest.raises(AssertionError, match="text encoder ran"):
        model.encode(["an uncached prompt"])


def test_cache_is_bounded_and_keeps_the_null_prompt(model, monkeypatch):
    model.null_condition(1)
    monkeypatch.setattr(model, "cache_size", 2)
    first = model.encode(["p one", "p two", "p three"])
    assert len(first) == 3 and set(model._cache) == {"", "p three"}
    model.encode(["p four"])
    assert set(model._cache) == {"", "p four"}
    assert torch.equal(model.encode(["p one"]).tensors["prompt_embeds"][0], first.tensors["prompt_embeds"][0])


def test_null_condition_is_the_empty_prompt(model, pipe):
    null = model.null_condition(3)
    assert len(null) == 3
    _, neg, _, neg_pooled = pipe.encode_prompt("x", None, None, do_classifier_free_guidance=True,
                                               max_sequence_length=MAX_SEQ)
    torch.testing.assert_close(null.tensors["prompt_embeds"][2:], neg)
    torch.testing.assert_close(null.tensors["pooled_prompt_embeds"][2:], neg_pooled)


def test_lora_only_on_target_modules_and_base_frozen(model):
    lora = {n for n, p in model.transformer.named_parameters() if "lora_" in n}
    params = model.trainable_parameters()
    assert len(params) == len(lora) > 0
    assert all(p.requires_grad and p.dtype == torch.float32 for p in params)
    wrapped = {n.split(".lora_")[0] for n in lora}
    assert all(n.endswith(tuple("." + t for t in TARGETS)) for n in wrapped)
    for target in TARGETS:  # every target kind got an adapter
        assert any(n.endswith("." + target) for n in wrapped), target
    frozen = [n for n, p in model.transformer.named_parameters() if "lora_" not in n]
    assert frozen and not any(dict(model.transformer.named_parameters())[n].requires_grad for n in frozen)
    for name in ("vae", "text_encoder", "text_encoder_2", "text_encoder_3"):
        assert not any(p.requires_grad for p in getattr(model.pipe, name).parameters())
    # r * (in + out) per wrapped Linear, r = 4
    modules = dict(model.transformer.named_modules())
    expected = sum(4 * (modules[n].base_layer.in_features + modules[n].base_layer.out_features) for n in wrapped)
    assert sum(p.numel() for p in params) == expected


def test_gradients_reach_only_lora(model, restore_lora):
    with torch.no_grad():
        for name, p in model.transformer.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    x = model.initial_noise([torch.Generator().manual_seed(4)])
    model.predict(x, torch.tensor([0.5]), model.encode(PROMPTS[:1])).square().mean().backward()
    grads = [p.grad for p in model.trainable_parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    assert all(p.grad is None for n, p in model.transformer.named_parameters() if "lora_" not in n)
    for p in model.trainable_parameters():
        p.grad = None


def test_reference_is_the_base_model(model, restore_lora):
    x = model.initial_noise([torch.Generator().manual_seed(5)] * 2)
    sigma, cond = torch.tensor([0.9, 0.4]), model.encode(PROMPTS)
    base = model.predict(x, sigma, cond)
    with model.reference():
        ref = model.predict(x, sigma, cond)
    assert torch.equal(ref, base)  # gaussian LoRA init: B = 0, the adapter adds nothing yet
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(torch.randn_like(p) * 0.05)
    trained = model.predict(x, sigma, cond)
    with model.reference():
        ref_after = model.predict(x, sigma, cond)
    assert (trained - base).abs().max() > 1e-4
    assert torch.equal(ref_after, base)
    assert all(p.requires_grad for p in model.trainable_parameters())  # restored after the context
    for p in model.trainable_parameters():  # a frozen adapter stays frozen (peft's enable would unfreeze it)
        p.requires_grad_(False)
    with model.reference():
        pass
    assert not any(p.requires_grad for p in model.trainable_parameters())
    for p in model.trainable_parameters():
        p.requires_grad_(True)


def test_trainable_state_dict_round_trip(model, restore_lora):
    x = model.initial_noise([torch.Generator().manual_seed(6)])
    sigma, cond = torch.tensor([0.6]), model.encode(PROMPTS[:1])
    state = model.trainable_state_dict()
    before = model.predict(x, sigma, cond)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(0.1)
    assert not torch.equal(model.predict(x, sigma, cond), before)
    model.load_trainable_state_dict(state)
    assert torch.equal(model.predict(x, sigma, cond), before)
    with pytest.raises(ConfigError, match="missing"):
        model.load_trainable_state_dict({})


def test_bfloat16_autocast_and_checkpointing(sd3_dir, model):
    half = SD3Model(path=sd3_dir, resolution=RESOLUTION, max_sequence_length=MAX_SEQ, lora_rank=4, lora_alpha=8,
                    dtype="bfloat16", device="cpu", gradient_checkpointing=True)
    assert half.transformer.dtype == torch.bfloat16 and half.transformer.gradient_checkpointing
    assert all(p.dtype == torch.float32 for p in half.trainable_parameters())
    x = model.initial_noise([torch.Generator().manual_seed(7)])
    sigma, prompts = torch.tensor([0.8]), PROMPTS[:1]
    v = half.predict(x, sigma, half.encode(prompts))
    assert v.dtype == torch.float32 and torch.isfinite(v).all()
    torch.testing.assert_close(v, model.predict(x, sigma, model.encode(prompts)), atol=0.1, rtol=0.1)
    half.predict(x, sigma, half.encode(prompts)).mean().backward()
    assert all(p.grad is not None for p in half.trainable_parameters())


def test_missing_directory_names_the_path(tmp_path, monkeypatch):
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigError, match="nowhere"):
        SD3Model(path=missing)
    monkeypatch.setenv("FLOWZOO_SD3_PATH", str(missing))
    with pytest.raises(ConfigError, match="nowhere"):
        SD3Model()
    monkeypatch.delenv("FLOWZOO_SD3_PATH")
    with pytest.raises(ConfigError, match="FLOWZOO_SD3_PATH"):
        SD3Model()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="model_index.json"):
        SD3Model(path=tmp_path / "empty")


@pytest.mark.parametrize("component", ["text_encoder_3", "vae"])
def test_missing_component_names_it(sd3_dir, tmp_path, component):
    broken = tmp_path / "broken_sd3"
    shutil.copytree(sd3_dir, broken)
    shutil.rmtree(broken / component)
    with pytest.raises(ConfigError) as err:
        SD3Model(path=broken)
    assert str(broken) in str(err.value) and repr(component) in str(err.value)


def test_bad_options_are_config_errors(sd3_dir):
    with pytest.raises(ConfigError, match="lora_targets"):
        SD3Model(path=sd3_dir, resolution=RESOLUTION, lora_targets=["no_such_layer"])
    with pytest.raises(ConfigError, match="float32"):
        SD3Model(path=sd3_dir, dtype="float8")
    with pytest.raises(ConfigError, match="resolution"):
        SD3Model(path=sd3_dir, resolution=33)


def test_missing_weights_file_is_a_config_error(sd3_dir, tmp_path):
    broken = tmp_path / "no_weights"
    shutil.copytree(sd3_dir, broken)
    for weights in (broken / "transformer").glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(ConfigError, match="no_weights"):
        SD3Model(path=broken)


def test_condition_is_batch_first(model):
    cond = model.encode(PROMPTS)
    assert isinstance(cond, Condition) and len(cond) == 2
    assert torch.equal(cond.index([1]).tensors["pooled_prompt_embeds"], model.encode(PROMPTS[1:]).tensors[
        "pooled_prompt_embeds"])


@pytest.mark.parametrize("algorithm", ["flow_grpo", "op_grpo", "diffusion_nft", "awm", "flow_dppo", "grpo_guard"])
def test_training_iterations_run_on_the_adapter(model, restore_lora, algorithm):
    from tests.adapter_training import check_training

    check_training(model, algorithm)
