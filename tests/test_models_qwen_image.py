"""The qwen_image adapter on a tiny random QwenImagePipeline (a 1-layer Qwen2.5-VL text encoder over a byte-level
tokenizer, QwenImageTransformer2DModel, the Qwen-Image VAE, Qwen-Image's scheduler with its terminal sigma) built in
code, saved and loaded through the adapter's real ``from_pretrained`` path: exact against the pipeline with true CFG,
prompt masks honoured, every algorithm trains one step on it."""

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
from flowzoo.models.qwen_image import QWEN_IMAGE_LORA_TARGETS, QwenImageModel  # noqa: E402
from tests.adapter_training import EVERY_ALGORITHM  # noqa: E402
from tests.tiny_pipelines import QWEN_MAX_SEQ, QWEN_RESOLUTION, build_tiny_qwen_image  # noqa: E402

PROMPTS = ["a cat", "two red dogs run far away"]  # different lengths: the batch pads the shorter one
ARGS = dict(resolution=QWEN_RESOLUTION, max_sequence_length=QWEN_MAX_SEQ, lora_rank=4, lora_alpha=8, device="cpu")


@pytest.fixture(scope="session")
def qwen_dir(tmp_path_factory):
    return build_tiny_qwen_image(tmp_path_factory.mktemp("tiny_qwen_image"))


@pytest.fixture(scope="module")
def model(qwen_dir):
    return QwenImageModel(path=qwen_dir, **ARGS)


@pytest.fixture(scope="module")
def pipe(qwen_dir):
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline.from_pretrained(qwen_dir)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_registered_with_qwen_images_schedule(model):
    assert models.get("qwen_image") is QwenImageModel and model.default_guidance == 4.0
    assert model.negative_prompt == " " and model.shift_terminal == 0.02
    # 4 packed tokens on Qwen-Image's line: mu = 0.5 + (0.9 - 0.5) / (8192 - 256) * (4 - 256)
    assert model.default_shift == pytest.approx(math.exp(0.5 + 0.4 / 7936 * (4 - 256)), rel=1e-12)
    assert model.latent_shape == (4, 16)


def test_true_cfg_sampling_and_decode_reproduce_the_pipeline(model, pipe):
    steps, guidance = 3, 4.0
    x1 = model.initial_noise([torch.Generator().manual_seed(s) for s in (1, 2)])
    kwargs = dict(prompt=PROMPTS, negative_prompt=[" ", " "], true_cfg_scale=guidance, height=QWEN_RESOLUTION,
                  width=QWEN_RESOLUTION, num_inference_steps=steps, max_sequence_length=QWEN_MAX_SEQ)
    expected = pipe(latents=x1.clone(), output_type="latent", **kwargs).images
    sigmas = sigma_schedule(steps, model.default_shift, grid=model.default_sigma_grid, terminal=model.shift_terminal)
    assert sigmas[-2] == pytest.approx(0.02)  # stretched to the terminal sigma
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas, atol=1e-6, rtol=0)
    cond, x = model.encode(PROMPTS), x1
    with torch.no_grad():
        for s, s_next in zip(sigmas[:-1], sigmas[1:]):
            x = x + model.velocity(x, torch.full((2,), float(s)), cond, guidance) * (s_next - s)
    assert (x - x1).abs().max() > 1e-2
    torch.testing.assert_close(x, expected, atol=1e-5, rtol=0)
    images = pipe(latents=x1.clone(), output_type="pt", **kwargs).images
    decoded = model.decode(x)
    assert decoded.shape == (2, 3, QWEN_RESOLUTION, QWEN_RESOLUTION) and 0 <= decoded.min() <= decoded.max() <= 1
    torch.testing.assert_close(decoded, images, atol=1e-5, rtol=0)


def test_cfg_is_norm_preserving(model):
    x = model.initial_noise([torch.Generator().manual_seed(3)] * 2)
    sigma, cond = torch.tensor([0.7, 0.7]), model.encode(PROMPTS)
    with torch.no_grad():
        v_cond, v_null = model.predict(x, sigma, cond), model.predict(x, sigma, model.null_condition(2))
        guided = model.velocity(x, sigma, cond, 4.0)
    combined = v_null + 4.0 * (v_cond - v_null)
    # per token: the direction of u + g (c - u), the length of c (a plain CFG combination would not hold either)
    torch.testing.assert_close(guided.norm(dim=-1), v_cond.norm(dim=-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(guided, combined * v_cond.norm(dim=-1, keepdim=True) / combined.norm(dim=-1,
                                                                                                 keepdim=True))
    assert (combined.norm(dim=-1) - v_cond.norm(dim=-1)).abs().max() > 1e-4


def test_prompt_embeddings_with_their_mask(model, pipe, monkeypatch):
    cond = model.encode(PROMPTS)
    mask = cond.tensors["prompt_embeds_mask"]
    assert cond.tensors["prompt_embeds"].shape == (2, QWEN_MAX_SEQ, 16) and mask.shape == (2, QWEN_MAX_SEQ)
    lengths = mask.sum(1)
    assert lengths[0] < lengths[1] < QWEN_MAX_SEQ  # padded, the padding masked
    embeds, pipe_mask = pipe.encode_prompt(PROMPTS, max_sequence_length=QWEN_MAX_SEQ)
    width = embeds.shape[1]
    torch.testing.assert_close(cond.tensors["prompt_embeds"][:, :width], embeds)
    assert torch.equal(mask[:, :width], pipe_mask) and not mask[:, width:].any()
    null, _ = pipe.encode_prompt(" ", max_sequence_length=QWEN_MAX_SEQ)
    torch.testing.assert_close(model.null_condition(1).tensors["prompt_embeds"][:, :null.shape[1]], null)
    # the mask is what makes padding harmless: a prompt alone (no padding in the call) gives the velocity it gets
    # beside a longer one, and garbage in its masked positions changes nothing
    x = model.initial_noise([torch.Generator().manual_seed(4)])
    sigma = torch.tensor([0.5])
    with torch.no_grad():
        alone = model.predict(x, sigma, model.encode(PROMPTS[:1]))
        beside = model.predict(torch.cat([x, x]), torch.cat([sigma, sigma]), cond)[:1]
        noisy = cond.index([0])
        noisy.tensors["prompt_embeds"][:, lengths[0]:] = torch.randn_like(noisy.tensors["prompt_embeds"][:, lengths[0]:])
        noisy.tensors["prompt_embeds_mask"] = noisy.tensors["prompt_embeds_mask"].clone()
        padded = model.predict(torch.cat([x, x]), torch.cat([sigma, sigma]), type(cond).cat([noisy, cond.index([1])]))[:1]
    torch.testing.assert_close(beside, alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=0)

    def boom(*args, **kwargs):
        raise AssertionError("text encoder ran for a cached prompt")

    monkeypatch.setattr(model.pipe.text_encoder, "forward", boom)
    assert torch.equal(model.encode(PROMPTS[:1]).tensors["prompt_embeds"], cond.tensors["prompt_embeds"][:1])


def test_attended_padding_is_the_releases_unmasked_text_and_moves_the_cfg_velocity(qwen_dir, model):
    """text_padding: attended passes no text mask (the release's diffusers ignored it): a prompt padded beside a
    longer one, and the negative " " in a true-CFG call, attend to their padding. On this tiny random pipeline the
    CFG 4 velocity moves by 0.8% (short prompt) and 2.6% (long prompt) of its norm (printed; the figures
    docs/models.md quotes)."""
    attended = QwenImageModel(path=qwen_dir, **ARGS, text_padding="attended")
    cond = model.encode(PROMPTS)
    x = model.initial_noise([torch.Generator().manual_seed(4), torch.Generator().manual_seed(5)])
    sigma = torch.tensor([0.5, 0.5])
    with torch.no_grad():
        alone = model.predict(x[:1], sigma[:1], model.encode(PROMPTS[:1]))
        assert torch.allclose(attended.predict(x[:1], sigma[:1], attended.encode(PROMPTS[:1])), alone, atol=1e-6)
        beside = attended.predict(x, sigma, cond)[:1]  # the short prompt, padded to the long one's length
        assert (beside - alone).abs().max() > 1e-4  # attended: a sample's velocity depends on its call's other prompts
        torch.testing.assert_close(model.predict(x, sigma, cond)[:1], alone, atol=1e-5, rtol=1e-5)  # masked: it does not
        masked_cfg, attended_cfg = model.velocity(x, sigma, cond, 4.0), attended.velocity(x, sigma, cond, 4.0)
    moved = ((attended_cfg - masked_cfg).norm(dim=(1, 2)) / masked_cfg.norm(dim=(1, 2))).tolist()
    print(f"qwen_image text_padding attended vs masked, CFG 4 velocity: relative change {moved[0]:.3f} (short "
          f"prompt), {moved[1]:.3f} (long prompt)")
    assert moved[0] > 1e-3 and moved[1] > 1e-3  # the negative " " is padded in both rows' call
    with pytest.raises(ConfigError, match="text_padding must be one of masked, attended, got 'none'"):
        QwenImageModel(path=qwen_dir, **ARGS, text_padding="none")


def test_lora_on_the_released_targets_and_reference_is_the_base(model, restore_lora):
    wrapped = {n.split(".lora_")[0] for n, _ in model.transformer.named_parameters() if "lora_" in n}
    assert len(wrapped) == len(QWEN_IMAGE_LORA_TARGETS)  # one block: each target once
    assert all(n.endswith(tuple("." + t for t in QWEN_IMAGE_LORA_TARGETS)) for n in wrapped)
    assert not any(p.requires_grad for n, p in model.transformer.named_parameters() if "lora_" not in n)
    assert not any(p.requires_grad for p in model.pipe.text_encoder.parameters())
    x = model.initial_noise([torch.Generator().manual_seed(5)])
    sigma, cond = torch.tensor([0.5]), model.encode(PROMPTS[:1])
    base = model.predict(x, sigma, cond)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(torch.randn_like(p) * 0.05)
    assert (model.predict(x, sigma, cond) - base).abs().max() > 1e-4
    with model.reference():
        assert torch.equal(model.predict(x, sigma, cond), base)


def test_bad_options_name_the_value(qwen_dir, monkeypatch):
    with pytest.raises(ConfigError, match=r"qwen_image resolution must be a positive multiple of 8.*got 12"):
        QwenImageModel(path=qwen_dir, resolution=12)
    monkeypatch.delenv("FLOWZOO_QWEN_IMAGE_PATH", raising=False)
    with pytest.raises(ConfigError, match="FLOWZOO_QWEN_IMAGE_PATH"):
        QwenImageModel()


@pytest.mark.parametrize("algorithm", EVERY_ALGORITHM)
def test_every_algorithm_trains_a_step(model, restore_lora, algorithm):
    from tests.adapter_training import check_training

    check_training(model, algorithm)


def test_transformer_calls_read_no_mask_with_the_host_lengths(model, restore_lora, monkeypatch):
    """Each prompt's valid length is read once when it is encoded and rides on the condition's host values, so a
    sampling loop with true CFG and a training step (OP-GRPO's replay included) never read a mask from the device
    per transformer call; a condition without them reads it (one sync) and gives the same velocity."""
    from flowzoo.models.base import Condition
    from tests.adapter_training import check_training

    cond = model.encode(PROMPTS)
    assert cond.host["text_length"] == tuple(cond.tensors["prompt_embeds_mask"].sum(dim=1).tolist())
    assert len(set(cond.host["text_length"])) == 2  # the prompts differ in length: the call trims to the longer
    x = torch.randn(2, *model.latent_shape, generator=torch.Generator().manual_seed(0))
    sigma = torch.full((2,), 0.7)
    with torch.no_grad():
        without_host = model.velocity(x, sigma, Condition(dict(cond.tensors)), 4.0)

    def no_read(mask):
        raise AssertionError("a transformer call read the mask from the device")

    monkeypatch.setattr(QwenImageModel, "_read_text_length", staticmethod(no_read))
    with torch.no_grad():
        assert torch.equal(model.velocity(x, sigma, cond, 4.0), without_host)
        assert torch.allclose(model.velocity(x[1:], sigma[1:], cond.index([1]), 4.0), without_host[1:], atol=1e-5)
    for algorithm in ("flow_grpo", "op_grpo"):
        check_training(model, algorithm)
