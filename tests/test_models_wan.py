"""The wan adapter on a tiny random WanPipeline (Wan2.1-T2V layout: UMT5 encoder, WanTransformer3DModel,
AutoencoderKLWan) built in code, saved to disk and loaded through the adapter's real ``from_pretrained`` path."""

from __future__ import annotations

import shutil

import pytest
import torch

from flowzoo.algorithms.engine.sde import sigma_schedule

pytest.importorskip("diffusers")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from flowzoo.errors import ConfigError  # noqa: E402
from flowzoo import models  # noqa: E402
from flowzoo.models.wan import WanModel  # noqa: E402

FRAMES, HEIGHT, WIDTH = 9, 16, 32
MAX_SEQ = 8
PROMPTS = ["a cat walks", "two red dogs run"]
Z_DIM = 4


def build_tiny_wan(directory):
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import T5Tokenizer, UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    words = ["a", "cat", "walks", "two", "red", "dogs", "run", "blue"]
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    vocab += [("\u2581" + w, -1.0) for w in words] + [(c, -5.0) for c in "abcdefghijklmnopqrstuvwxyz"]
    tokenizer = T5Tokenizer(vocab=vocab, extra_ids=0)
    text_encoder = UMT5EncoderModel(
        UMT5Config(vocab_size=len(vocab), d_model=32, d_kv=8, d_ff=32, num_layers=2, num_heads=4,
                   relative_attention_num_buckets=8, decoder_start_token_id=0)
    )
    vae = AutoencoderKLWan(
        base_dim=3, z_dim=Z_DIM, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True],
        latents_mean=[0.1, -0.2, 0.3, 0.05], latents_std=[1.5, 2.0, 0.8, 1.2],
    )
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=Z_DIM, out_channels=Z_DIM,
        text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    )
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))
    pipe.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def wan_dir(tmp_path_factory):
    return build_tiny_wan(tmp_path_factory.mktemp("tiny_wan"))


@pytest.fixture(scope="module")
def model(wan_dir):
    return WanModel(path=wan_dir, frames=FRAMES, height=HEIGHT, width=WIDTH, max_sequence_length=MAX_SEQ,
                    lora_rank=4, lora_alpha=8, device="cpu")


@pytest.fixture(scope="module")
def pipe(wan_dir):
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(wan_dir)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_registered_as_video():
    assert models.get("wan") is WanModel and WanModel.sample_kind == "video"


def test_ode_sampling_and_decode_reproduce_the_pipeline(model, pipe):
    steps, guidance = 3, 4.5
    x1 = model.initial_noise([torch.Generator().manual_seed(s) for s in (1, 2)])
    assert x1.shape == (2, Z_DIM, (FRAMES - 1) // 4 + 1, HEIGHT // 8, WIDTH // 8)
    kwargs = dict(prompt=PROMPTS, height=HEIGHT, width=WIDTH, num_frames=FRAMES, num_inference_steps=steps,
                  guidance_scale=guidance, max_sequence_length=MAX_SEQ)
    expected = pipe(latents=x1.clone(), output_type="latent", **kwargs).frames
    # the velocity against the tiny pipeline's Euler scheduler on its own grid (the model's default grid is Wan2.1's
    # UniPC flow sigmas: test_the_sigma_grid_is_wan2_1s_unipc_flow_grid)
    sigmas = sigma_schedule(steps, model.default_shift)
    assert torch.equal(sigmas, pipe.scheduler.sigmas)
    x, cond = x1, model.encode(PROMPTS)
    for s, s_next in zip(sigmas[:-1], sigmas[1:]):
        x = x + model.velocity(x, torch.full((2,), float(s)), cond, guidance) * (s_next - s)
    assert (x - x1).abs().max() > 1e-2
    torch.testing.assert_close(x, expected, atol=1e-4, rtol=0)

    video = pipe(latents=x1.clone(), output_type="pt", **kwargs).frames
    decoded = model.decode(x)
    assert decoded.shape == (2, FRAMES, 3, HEIGHT, WIDTH) == video.shape and decoded.dtype == torch.float32
    assert decoded.min() >= 0 and decoded.max() <= 1
    torch.testing.assert_close(decoded, video, atol=1e-4, rtol=0)


@pytest.mark.parametrize("steps", [1, 10, 20, 50])
def test_the_sigma_grid_is_wan2_1s_unipc_flow_grid(model, steps):
    """Wan2.1's scheduler: UniPCMultistepScheduler with flow sigmas and flow_shift 3 (models/wan.py: the config)."""
    from diffusers import UniPCMultistepScheduler

    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    scheduler.set_timesteps(steps)
    ours = sigma_schedule(steps, model.default_shift, grid=model.default_sigma_grid, terminal=model.shift_terminal)
    assert model.default_sigma_grid == "unipc_flow" and model.default_shift == 3.0
    assert torch.equal(ours, scheduler.sigmas)
    if steps == 20:  # the last non-zero sigma, against SD3's Euler grid's 0.0089
        assert ours[-2].item() == pytest.approx(0.1387, abs=1e-4)
        assert sigma_schedule(steps, 3.0)[-2].item() == pytest.approx(0.0089, abs=1e-4)


def test_training_and_the_pipeline_evaluation_sample_on_the_unipc_grid(model):
    """Flow-GRPO (the model's grid) trains on it; the ``pipeline`` evaluation protocol scores on it at 50 steps."""
    from types import SimpleNamespace

    from flowzoo import algorithms
    from flowzoo.benchmark.measures.evaluation import protocol_sampler
    from tests.adapter_training import MeanBrightness

    alg = algorithms.get("flow_grpo")(model, MeanBrightness(), {"group_size": 2, "clip_range": 1e-3, "lr": 1e-4},
                                      seed=0)
    assert torch.equal(alg.sigmas, sigma_schedule(20, 3.0, grid="unipc_flow"))
    train = SimpleNamespace(eval_sampler="pipeline", eval_shift=None, eval_guidance=None, eval_num_steps=None)
    evaluation = protocol_sampler(train, model, alg)
    assert torch.equal(evaluation.sigmas, sigma_schedule(50, 3.0, grid="unipc_flow"))
    assert evaluation.sigmas[-2].item() == pytest.approx(0.0604, abs=1e-4)


def test_guidance_changes_the_velocity(model):
    x = model.initial_noise([torch.Generator().manual_seed(3)] * 2)
    sigma, cond = torch.tensor([0.7, 0.7]), model.encode(PROMPTS)
    v1, v45 = model.velocity(x, sigma, cond, 1.0), model.velocity(x, sigma, cond, 4.5)
    torch.testing.assert_close(v1, model.predict(x, sigma, cond))
    assert (v1 - v45).abs().max() > 1e-3


def test_encode_matches_pipeline_and_is_cached(model, pipe, monkeypatch):
    first = model.encode(["a blue cat"])
    direct, _ = pipe.encode_prompt("a blue cat", do_classifier_free_guidance=False, max_sequence_length=MAX_SEQ)
    torch.testing.assert_close(first.tensors["prompt_embeds"], direct)
    null, _ = pipe.encode_prompt("", do_classifier_free_guidance=False, max_sequence_length=MAX_SEQ)
    torch.testing.assert_close(model.null_condition(2).tensors["prompt_embeds"][1:], null)

    def boom(*args, **kwargs):
        raise AssertionError("text encoder ran for a cached prompt")

    monkeypatch.setattr(model.pipe.text_encoder, "forward", boom)
    again = model.encode(["a blue cat"])
    assert torch.equal(again.tensors["prompt_embeds"], first.tensors["prompt_embeds"])
    with pytest.raises(AssertionError, match="text encoder ran"):
        model.encode(["not cached yet"])


def test_lora_on_attention_only_and_base_frozen(model):
    wrapped = {n.split(".lora_")[0] for n, _ in model.transformer.named_parameters() if "lora_" in n}
    assert wrapped and all(n.endswith((".to_q", ".to_k", ".to_v", ".to_out.0")) for n in wrapped)
    assert any(".attn1." in n for n in wrapped) and any(".attn2." in n for n in wrapped)
    assert all(p.requires_grad for p in model.trainable_parameters())
    assert not any(p.requires_grad for n, p in model.transformer.named_parameters() if "lora_" not in n)
    assert not any(p.requires_grad for p in model.pipe.text_encoder.parameters())
    assert not any(p.requires_grad for p in model.pipe.vae.parameters())


def test_reference_is_the_base_model(model, restore_lora):
    x = model.initial_noise([torch.Generator().manual_seed(5)])
    sigma, cond = torch.tensor([0.5]), model.encode(PROMPTS[:1])
    base = model.predict(x, sigma, cond)
    with model.reference():
        assert torch.equal(model.predict(x, sigma, cond), base)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(torch.randn_like(p) * 0.05)
    assert (model.predict(x, sigma, cond) - base).abs().max() > 1e-4
    with model.reference():
        assert torch.equal(model.predict(x, sigma, cond), base)


def test_bad_video_shape_and_missing_component(wan_dir, tmp_path):
    with pytest.raises(ConfigError, match="frames"):
        WanModel(path=wan_dir, frames=10, height=HEIGHT, width=WIDTH)
    with pytest.raises(ConfigError, match="height"):
        WanModel(path=wan_dir, frames=FRAMES, height=20, width=WIDTH)
    broken = tmp_path / "broken_wan"
    shutil.copytree(wan_dir, broken)
    shutil.rmtree(broken / "text_encoder")
    with pytest.raises(ConfigError) as err:
        WanModel(path=broken)
    assert str(broken) in str(err.value) and "'text_encoder'" in str(err.value)
    with pytest.raises(ConfigError, match="does_not_exist"):
        WanModel(path=tmp_path / "does_not_exist")


@pytest.mark.parametrize("algorithm", ["flow_grpo", "op_grpo", "diffusion_nft", "awm"])
def test_training_iterations_run_on_the_adapter(model, restore_lora, algorithm):
    from tests.adapter_training import check_training

    check_training(model, algorithm)
