"""The wan22 adapter on tiny random Wan2.2 WanPipelines built in code, saved to disk and loaded through the adapter's
real ``from_pretrained`` path: the two-expert A14B layout (``transformer`` / ``transformer_2``, ``boundary_ratio``)
and the TI2V-5B layout (one transformer, the residual patch-2 VAE, ``expand_timesteps``)."""

from __future__ import annotations

import os

import pytest
import torch
import yaml

from flowzoo.algorithms.engine.sde import sigma_schedule

pytest.importorskip("diffusers")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from flowzoo.benchmark.cli import main  # noqa: E402
from flowzoo.errors import ConfigError  # noqa: E402
from flowzoo import models  # noqa: E402
from flowzoo.models.wan import WanModel  # noqa: E402
from flowzoo.models.wan22 import LOW_NOISE, Wan22Model  # noqa: E402
from tests.test_models_wan import FRAMES, HEIGHT, MAX_SEQ, PROMPTS, WIDTH, Z_DIM, build_tiny_wan  # noqa: E402

#: the tiny A14B's boundary (the I2V-A14B's ratio); the parity tests move it onto a step of their grid
BOUNDARY_RATIO = 0.9
#: the TI2V layout's sizes: 16x spatial VAE and 2 x 2 patches make 32-pixel multiples
TI2V_Z, TI2V_HEIGHT, TI2V_WIDTH = 6, 32, 64
STEPS, GUIDANCE, GUIDANCE_2 = 4, 4.5, 2.0
#: the same noise: pixels in [0, 1] within 1e-6; latents (values of a few units) within 1e-5, the float32 rounding of
#: the adapter's one batched CFG call against the pipeline's two (a wrong expert or scale moves them by > 1e-3)
PIXELS, LATENTS = 1e-6, 1e-5


def _transformer(channels: int, seed: int):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=channels,
        out_channels=channels, text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    )


def build_tiny_wan22(directory, ti2v: bool = False):
    """The tiny Wan2.1 pipeline (tests/test_models_wan.py) made Wan2.2: a second expert of other random weights and
    ``boundary_ratio``, or (``ti2v``) the TI2V-5B layout."""
    from diffusers import AutoencoderKLWan, WanPipeline

    base = WanPipeline.from_pretrained(build_tiny_wan(directory / "wan21"))
    parts = {k: base.components[k] for k in ("tokenizer", "text_encoder", "scheduler")}
    if ti2v:
        torch.manual_seed(1)
        vae = AutoencoderKLWan(base_dim=4, decoder_base_dim=8, z_dim=TI2V_Z, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                               temperal_downsample=[False, True, True], is_residual=True, in_channels=12,
                               out_channels=12, patch_size=2, scale_factor_spatial=16,
                               latents_mean=[0.1, -0.2, 0.3, 0.05, 0.0, -0.1], latents_std=[1.5, 2.0, 0.8, 1.2, 1, 0.9])
        pipe = WanPipeline(vae=vae, transformer=_transformer(TI2V_Z, 2), expand_timesteps=True, **parts)
    else:
        pipe = WanPipeline(vae=base.vae, transformer=base.transformer, transformer_2=_transformer(Z_DIM, 5),
                           boundary_ratio=BOUNDARY_RATIO, **parts)
    pipe.save_pretrained(directory / "wan22")
    return directory / "wan22"


@pytest.fixture(scope="session")
def a14b_dir(tmp_path_factory):
    return build_tiny_wan22(tmp_path_factory.mktemp("tiny_wan22"))


@pytest.fixture(scope="session")
def ti2v_dir(tmp_path_factory):
    return build_tiny_wan22(tmp_path_factory.mktemp("tiny_wan22_ti2v"), ti2v=True)


def _model(path, **kwargs):
    args = dict(frames=FRAMES, height=HEIGHT, width=WIDTH, max_sequence_length=MAX_SEQ, lora_rank=4, lora_alpha=8,
                guidance_2=GUIDANCE_2, device="cpu")
    return Wan22Model(path=path, **{**args, **kwargs})


@pytest.fixture(scope="module")
def model(a14b_dir):
    return _model(a14b_dir)


@pytest.fixture(scope="module")
def pipe(a14b_dir):
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(a14b_dir)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture
def exact_boundary(model, pipe):
    """The boundary moved onto step 2's timestep of the test grid (steps 0-2 high-noise, step 3 low-noise), in the
    pipeline's and the adapter's config, so ``>=`` against ``>`` decides a step."""
    pipe.scheduler.set_timesteps(STEPS)
    ratio = pipe.scheduler.timesteps[2].item() / 1000
    for p in (pipe, model.pipe):
        p.register_to_config(boundary_ratio=ratio)
    yield ratio
    for p in (pipe, model.pipe):
        p.register_to_config(boundary_ratio=BOUNDARY_RATIO)


def _sample(model, x1, prompts, guidance=GUIDANCE):
    """The adapter's ODE sample on the tiny pipeline's Euler grid (shift 3: test_models_wan.py's reason)."""
    sigmas = sigma_schedule(STEPS, 3.0)
    x, cond = x1, model.encode(prompts)
    with torch.no_grad():
        for s, s_next in zip(sigmas[:-1], sigmas[1:]):
            x = x + model.velocity(x, torch.full((len(x),), float(s)), cond, guidance) * (s_next - s)
    return x


def _pipeline(pipe, x1, prompts, output_type="pt", guidance=GUIDANCE):
    return pipe(prompt=prompts, height=HEIGHT, width=WIDTH, num_frames=FRAMES, num_inference_steps=STEPS,
                guidance_scale=guidance, guidance_scale_2=GUIDANCE_2, max_sequence_length=MAX_SEQ, latents=x1.clone(),
                output_type=output_type).frames


def _noise(model, seeds=(1, 2)):
    return model.initial_noise([torch.Generator().manual_seed(s) for s in seeds])


def test_registered_with_its_facts():
    cls = models.get("wan22")
    assert cls is Wan22Model and issubclass(cls, WanModel) and cls.sample_kind == "video"
    assert (cls.default_guidance, cls.default_shift, cls.default_num_steps, cls.default_eval_num_steps,
            cls.default_rollout_batch) == (4.0, 12.0, 10, 40, 1)
    assert cls.lora_format == "WanPipeline" and cls.architecture.label == "Wan2.2-T2V-A14B"


def test_two_experts_sample_and_decode_as_the_pipeline(model, pipe, exact_boundary):
    x1 = _noise(model)
    expected = _pipeline(pipe, x1, PROMPTS, "latent")
    x = _sample(model, x1, PROMPTS)
    assert (x - x1).abs().max() > 1e-2
    torch.testing.assert_close(x, expected, atol=LATENTS, rtol=0)
    video = _pipeline(pipe, x1, PROMPTS)
    decoded = model.decode(x)
    assert decoded.shape == (2, FRAMES, 3, HEIGHT, WIDTH) == video.shape
    torch.testing.assert_close(decoded, video, atol=PIXELS, rtol=0)


def test_each_step_runs_the_expert_the_pipeline_runs(model, pipe, exact_boundary):
    """Forward hooks on both experts record which one each step calls, in the pipeline and in the adapter."""
    def calls(run, transformers):
        seen = []
        hooks = [t.register_forward_hook(lambda *_, i=i: seen.append(i)) for i, t in enumerate(transformers)]
        try:
            run()
        finally:
            for h in hooks:
                h.remove()
        return seen

    x1 = _noise(model, (3,))
    ours = calls(lambda: _sample(model, x1, PROMPTS[:1]), [model.transformer, model.pipe.transformer_2])
    theirs = calls(lambda: _pipeline(pipe, x1, PROMPTS[:1], "latent"), [pipe.transformer, pipe.transformer_2])
    assert theirs == [0, 0, 0, 0, 0, 0, 1, 1]  # cond and uncond per step: the boundary step is the high expert's
    assert ours == [0, 0, 0, 1]  # one batched CFG call per step
    sigmas = sigma_schedule(STEPS, 3.0)[:-1]
    assert model.high_noise(sigmas).tolist() == [True, True, True, False]


@pytest.mark.parametrize("bug", ["swapped experts", "boundary off by one", "one guidance scale"])
def test_a_planted_bug_fails_the_parity(model, pipe, exact_boundary, monkeypatch, bug):
    high_noise = model.high_noise
    if bug == "swapped experts":
        monkeypatch.setattr(model, "high_noise", lambda sigma: ~high_noise(sigma))
    elif bug == "boundary off by one":
        monkeypatch.setattr(model, "high_noise", lambda sigma: sigma.float() * 1000 > model.boundary_timestep)
    else:
        monkeypatch.setattr(model, "guidance_2", GUIDANCE)
    x1 = _noise(model)
    assert (_sample(model, x1, PROMPTS) - _pipeline(pipe, x1, PROMPTS, "latent")).abs().max() > 100 * LATENTS


def test_rows_at_different_sigmas_each_take_their_expert(model):
    x = _noise(model, (4, 5))
    cond, sigma = model.encode(PROMPTS), torch.tensor([0.95, 0.5])
    both = model.velocity(x, sigma, cond, GUIDANCE)
    for i in range(2):
        torch.testing.assert_close(both[i:i + 1], model.velocity(x[i:i + 1], sigma[i:i + 1], cond.index([i]),
                                                                 GUIDANCE), atol=1e-6, rtol=0)


def test_ti2v_layout_samples_and_decodes_as_the_pipeline(ti2v_dir):
    from diffusers import WanPipeline

    ours = _model(ti2v_dir, height=TI2V_HEIGHT, width=TI2V_WIDTH)
    assert ours._second is None and ours.latent_shape == (TI2V_Z, (FRAMES - 1) // 4 + 1, 2, 4)
    pipe = WanPipeline.from_pretrained(ti2v_dir)
    pipe.set_progress_bar_config(disable=True)
    x1 = _noise(ours)
    x = _sample(ours, x1, PROMPTS)
    kwargs = dict(prompt=PROMPTS, height=TI2V_HEIGHT, width=TI2V_WIDTH, num_frames=FRAMES, num_inference_steps=STEPS,
                  guidance_scale=GUIDANCE, max_sequence_length=MAX_SEQ)
    torch.testing.assert_close(x, pipe(latents=x1.clone(), output_type="latent", **kwargs).frames, atol=LATENTS,
                               rtol=0)
    video = pipe(latents=x1.clone(), output_type="pt", **kwargs).frames
    assert video.shape == (2, FRAMES, 3, TI2V_HEIGHT, TI2V_WIDTH)
    torch.testing.assert_close(ours.decode(x), video, atol=PIXELS, rtol=0)


def test_lora_on_both_experts_and_reference_is_both_bases(model, restore_lora):
    names = list(model.trainable_state_dict())
    low = [n for n in names if n.startswith(f"{LOW_NOISE}.")]
    assert low and len(low) * 2 == len(names)
    for transformer in (model.transformer, model.pipe.transformer_2):
        wrapped = {n.split(".lora_")[0] for n, _ in transformer.named_parameters() if "lora_" in n}
        assert wrapped and any(".attn1." in n for n in wrapped) and any(".attn2." in n for n in wrapped)
        assert not any(p.requires_grad for n, p in transformer.named_parameters() if "lora_" not in n)
    assert len(model.trainable_parameters()) == len(names) and len(model.fsdp_modules()) == 2
    x, cond = _noise(model, (6,))[:1], model.encode(PROMPTS[:1])
    sigmas = [torch.tensor([0.95]), torch.tensor([0.3])]  # one row per expert
    base = [model.predict(x, s, cond) for s in sigmas]
    with torch.no_grad():
        for name, p in zip(names, model.trainable_parameters()):
            if name.startswith(LOW_NOISE):  # only the low-noise expert's LoRA moves
                p.add_(torch.randn_like(p) * 0.05)
    moved = [model.predict(x, s, cond) for s in sigmas]
    assert torch.equal(moved[0], base[0]) and (moved[1] - base[1]).abs().max() > 1e-4
    with model.reference():
        assert all(torch.equal(model.predict(x, s, cond), b) for s, b in zip(sigmas, base))
    assert all(p.requires_grad for p in model.trainable_parameters())  # as before: peft's toggling undone
    assert torch.equal(model.predict(x, sigmas[1], cond), moved[1])


def test_trainable_state_round_trips_both_experts(model, restore_lora):
    state = model.trainable_state_dict()
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.zero_()
    model.load_trainable_state_dict(state)
    assert all(torch.equal(v, model.trainable_state_dict()[k]) for k, v in state.items())
    with pytest.raises(ConfigError, match="missing"):
        model.load_trainable_state_dict({k: v for k, v in state.items() if not k.startswith(LOW_NOISE)})


def test_full_fine_tuning_trains_both_experts_against_frozen_copies(a14b_dir):
    full = _model(a14b_dir, finetune="full")
    assert len(full.fsdp_modules()) == 4  # each expert and its frozen reference copy
    x, cond, sigma = _noise(full, (7,))[:1], full.encode(PROMPTS[:1]), torch.tensor([0.3])
    before = full.predict(x, sigma, cond)
    with torch.no_grad():
        full.pipe.transformer_2.proj_out.bias.add_(0.1)
    assert (full.predict(x, sigma, cond) - before).abs().max() > 1e-2
    with full.reference():
        assert torch.equal(full.predict(x, sigma, cond), before)
    assert any(n.startswith(f"{LOW_NOISE}.") for n in full.trainable_state_dict())


def test_bad_directories_are_one_line(a14b_dir, tmp_path):
    import json
    import shutil

    with pytest.raises(ConfigError, match="the adapter for it: wan22"):
        WanModel(path=a14b_dir, frames=FRAMES, height=HEIGHT, width=WIDTH)
    broken = tmp_path / "no_boundary"
    shutil.copytree(a14b_dir, broken)
    index = json.loads((broken / "model_index.json").read_text())
    (broken / "model_index.json").write_text(json.dumps({**index, "boundary_ratio": None}))
    with pytest.raises(ConfigError, match="no boundary_ratio"):
        _model(broken)
    with pytest.raises(ConfigError, match="frames"):
        _model(a14b_dir, frames=10)


def test_memory_footprint_reads_the_shape_of_the_directory(a14b_dir, tmp_path):
    """The A14B (a transformer_2 listed, or no directory here) or the TI2V-5B (one 48-channel transformer)."""
    import json

    args = {"frames": 81, "height": 704, "width": 1280, "max_sequence_length": 512}
    for path in (None, str(a14b_dir)):
        a14b = Wan22Model.footprint({**args, "path": path})
        assert a14b.arch.label == "Wan2.2-T2V-A14B" and a14b.tokens == 21 * 44 * 80
        assert a14b.latent_numbers == 16 * 21 * 88 * 160
    (tmp_path / "transformer").mkdir()
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline", "expand_timesteps": True,
                                                           "transformer_2": [None, None]}))
    (tmp_path / "transformer" / "config.json").write_text(json.dumps({"in_channels": 48}))
    ti2v = Wan22Model.footprint({**args, "path": str(tmp_path)})
    assert ti2v.arch.label == "Wan2.2-TI2V-5B" and ti2v.tokens == 21 * 22 * 40
    assert ti2v.latent_numbers == 48 * 21 * 44 * 80


def test_exported_loras_load_into_both_experts_of_the_pipeline(a14b_dir, tmp_path):
    """A sealed checkpoint of a wan22 run: ``flowzoo export`` writes one LoRA file per expert, and WanPipeline with
    both loaded (the second with ``load_into_transformer_2``) samples what the adapter samples."""
    from diffusers import WanPipeline

    from flowzoo.benchmark.run.checkpoints import seal
    from flowzoo.benchmark.run.loading import load_config
    from flowzoo.io import atomic_torch_save

    args = {"path": str(a14b_dir), "frames": FRAMES, "height": HEIGHT, "width": WIDTH, "lora_rank": 4,
            "lora_alpha": 8, "max_sequence_length": MAX_SEQ, "guidance_2": GUIDANCE_2, "device": "cpu"}
    (tmp_path / "p.txt").write_text("a cat walks\n")
    run = tmp_path / "run"
    run.mkdir()
    config = {"task": "tiny_wan22", "algorithm": {"name": "flow_grpo"}, "model": {"name": "wan22", "args": args},
              "reward": "video_ocr", "train": {"steps": 2},
              "prompts": {"source": "files", "train": str(tmp_path / "p.txt"), "test": str(tmp_path / "p.txt")}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    ours = Wan22Model(**args)
    torch.manual_seed(3)
    lora = {k: v + 0.05 * torch.randn_like(v) for k, v in ours.trainable_state_dict().items()}  # "trained"
    ours.load_trainable_state_dict(lora)
    state = {"step": 1, "algorithm": {"model": lora}, "rows": [{"step": 0}, {"step": 1}], "wall_s": 0.0, "nfe": 0}
    atomic_torch_save(seal(state, load_config(run / "config.yaml")), run / "checkpoint.pt")
    out = tmp_path / "lora"
    assert main(["export", str(run), "--out", str(out)]) == 0
    assert {p.name for p in out.glob("*.safetensors")} == {"pytorch_lora_weights.safetensors",
                                                           "pytorch_lora_weights_transformer_2.safetensors"}
    assert "load_into_transformer_2=True" in (out / "README.md").read_text()
    pipe = WanPipeline.from_pretrained(a14b_dir)
    pipe.set_progress_bar_config(disable=True)
    pipe.load_lora_weights(out)
    pipe.load_lora_weights(out, weight_name="pytorch_lora_weights_transformer_2.safetensors",
                           load_into_transformer_2=True)
    x1 = _noise(ours)
    torch.testing.assert_close(_sample(ours, x1, PROMPTS), _pipeline(pipe, x1, PROMPTS, "latent"), atol=1e-5, rtol=0)
    with ours.reference():
        base = _sample(ours, x1, PROMPTS)
    assert (base - _sample(ours, x1, PROMPTS)).abs().max() > 1e-3


@pytest.mark.parametrize("algorithm", ["flow_grpo", "awm"])
def test_training_iterations_train_both_experts(model, restore_lora, algorithm, request):
    """The shared checks (tests/adapter_training.py), the low-noise expert's base frozen, and (Flow-GRPO, which trains
    the rollout's steps) both experts' LoRA moved: the boundary (0.97 here) splits the 3 steps on the model's grid
    (shift 12: sigma 1 | 0.96, 0.86). AWM's update draws a time per row, so its calls mix the experts' rows."""
    from tests.adapter_training import check_training

    model.pipe.register_to_config(boundary_ratio=0.97)
    request.addfinalizer(lambda: model.pipe.register_to_config(boundary_ratio=BOUNDARY_RATIO))

    low_base = {n: p.detach().clone() for n, p in model.pipe.transformer_2.named_parameters() if "lora_" not in n}
    before = model.trainable_state_dict()
    check_training(model, algorithm)
    after = model.trainable_state_dict()
    for prefix in (False, True) if algorithm == "flow_grpo" else ():  # AWM's per-row times may miss an expert
        assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith(LOW_NOISE) == prefix)
    assert all(torch.equal(p, low_base[n]) for n, p in model.pipe.transformer_2.named_parameters() if n in low_base)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
@pytest.mark.skipif(os.environ.get("FLOWZOO_SCALE_MATRIX") != "full",
                    reason="a 2-process rehearsal of about a minute: make scale-check runs it (FLOWZOO_SCALE_MATRIX=full)")
def test_sharded_two_process_rehearsal(tmp_path, monkeypatch):
    """tests/scale_rehearsal.py's rehearsal (sharded on 2 processes with the lockstep check, stopped and resumed on
    1, replicated, equal metrics, eval and export) of paper-wan-video's AWM recipe on the tiny A14B: AWM draws a time
    per row, so the processes' calls hold different mixes of the experts' rows."""
    from tests import scale_matrix, scale_rehearsal

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with scale_matrix.half_constant_reward():
        config = dict(scale_rehearsal.cells("paper-wan-video", tmp_path))["awm"]
        data = yaml.safe_load(config.read_text())
        data["model"]["name"] = "wan22"
        data["model"]["args"].update(path=str(build_tiny_wan22(tmp_path / "wan22")), guidance_2=GUIDANCE_2)
        config.write_text(yaml.safe_dump(data, sort_keys=False))
        problems = scale_rehearsal.rehearse(config, tmp_path / "awm")
    assert not problems, "\n".join(problems)
