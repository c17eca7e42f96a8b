"""The flux_kontext adapter on a tiny random FluxKontextPipeline (the flux tests' components under the Kontext
pipeline) built in code, saved and loaded through the adapter's real ``from_pretrained`` path: a sample from the same
noise and source image equals the pipeline's, a wrong position of the source's tokens fails that, the LoRA exports
for ``load_lora_weights``, every algorithm trains a step on edit prompts, and OP-GRPO replays an edit with its own
source."""

from __future__ import annotations

import math
import os

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from flowzoo import models  # noqa: E402
from flowzoo.algorithms.engine.sde import sigma_schedule  # noqa: E402
from flowzoo.errors import ConfigError  # noqa: E402
from flowzoo.models.flux import FLUX_LORA_TARGETS  # noqa: E402
from flowzoo.models.flux_kontext import FluxKontextModel  # noqa: E402
from flowzoo.source_images import SOURCE_IMAGE  # noqa: E402
from tests.adapter_training import EVERY_ALGORITHM  # noqa: E402
from tests.tiny_pipelines import FLUX_MAX_SEQ, FLUX_RESOLUTION, build_tiny_flux  # noqa: E402

R = FLUX_RESOLUTION
PROMPTS = ["make the cat red", "add a dog"]
ARGS = dict(resolution=R, max_sequence_length=FLUX_MAX_SEQ, lora_rank=4, lora_alpha=8, device="cpu")


def source(seed: int, size: int = R) -> torch.Tensor:
    """A random source image [3, size, size] in [0, 1]."""
    return torch.rand(3, size, size, generator=torch.Generator().manual_seed(seed))


SOURCES = [source(7), source(8)]
METADATA = [{SOURCE_IMAGE: s} for s in SOURCES]


@pytest.fixture(scope="session")
def kontext_dir(tmp_path_factory):
    return build_tiny_flux(tmp_path_factory.mktemp("tiny_kontext"), tmp_path_factory.mktemp("kontext_tok"),
                           pipeline_class="FluxKontextPipeline")


@pytest.fixture(scope="module")
def model(kontext_dir):
    return FluxKontextModel(path=kontext_dir, **ARGS)


@pytest.fixture(scope="module")
def pipe(kontext_dir):
    from diffusers import FluxKontextPipeline

    pipe = FluxKontextPipeline.from_pretrained(kontext_dir)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def pipeline_call(pipe, x1, steps, true_cfg, output_type):
    """FluxKontextPipeline on the same noise and sources, at the target's size (max_area R^2, the sources kept at
    their size: no _auto_resize to the ~1 MP preferred resolutions)."""
    kwargs = dict(prompt=PROMPTS, image=torch.stack(SOURCES), height=R, width=R, max_area=R * R, _auto_resize=False,
                  num_inference_steps=steps, guidance_scale=3.5, max_sequence_length=FLUX_MAX_SEQ)
    if true_cfg != 1.0:
        kwargs.update(negative_prompt=["", ""], true_cfg_scale=true_cfg)
    return pipe(latents=x1.clone(), output_type=output_type, **kwargs).images


def sample(model, x1, steps, true_cfg):
    sigmas = sigma_schedule(steps, model.default_shift, grid=model.default_sigma_grid)
    cond, x = model.encode(PROMPTS, METADATA), x1
    with torch.no_grad():
        for s, s_next in zip(sigmas[:-1], sigmas[1:]):
            x = x + model.velocity(x, torch.full((2,), float(s)), cond, true_cfg) * (s_next - s)
    return x, sigmas


def test_registered_with_the_target_tokens_schedule(model):
    assert models.get("flux_kontext") is FluxKontextModel and model.sample_kind == "image"
    assert model.lora_format == "FluxKontextPipeline" and model.default_lora_targets == FLUX_LORA_TARGETS
    assert model.latent_shape == (16, 16)  # the target's tokens only; the source's ride in the condition
    # 16 target tokens (the source's do not count): mu = 0.5 + (1.15 - 0.5) / 3840 * (16 - 256), as FLUX's
    assert model.default_shift == pytest.approx(math.exp(0.5 + 0.65 / 3840 * (16 - 256)), rel=1e-12)
    fp = FluxKontextModel.footprint({"resolution": 512, "max_sequence_length": 512})
    flux = models.get("flux").footprint({"resolution": 512, "max_sequence_length": 512})
    assert fp.tokens == flux.tokens + 32 * 32 and fp.arch.transformer_params == flux.arch.transformer_params


@pytest.mark.parametrize("true_cfg", [1.0, 3.0])
def test_a_sample_and_its_pixels_reproduce_the_pipeline(model, pipe, true_cfg):
    steps = 3
    x1 = model.initial_noise([torch.Generator().manual_seed(s) for s in (1, 2)])
    nfe = model.nfe
    x, sigmas = sample(model, x1, steps, true_cfg)
    assert model.nfe - nfe == steps * 2 * (2 if true_cfg != 1.0 else 1)
    expected = pipeline_call(pipe, x1, steps, true_cfg, "latent")
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas, atol=1e-6, rtol=0)  # the shift of the target tokens
    assert (x - x1).abs().max() > 1e-2
    torch.testing.assert_close(x, expected, atol=1e-6, rtol=0)
    images = pipeline_call(pipe, x1, steps, true_cfg, "pt")
    decoded = model.decode(x)
    assert decoded.shape == (2, 3, R, R) and 0 <= decoded.min() <= decoded.max() <= 1
    torch.testing.assert_close(decoded, images, atol=1e-6, rtol=0)


@pytest.mark.parametrize("bug", ["source at the target's positions", "no source tokens", "other rows' sources"])
def test_a_planted_bug_fails_the_parity(model, pipe, monkeypatch, bug):
    x1 = model.initial_noise([torch.Generator().manual_seed(s) for s in (1, 2)])
    expected = pipeline_call(pipe, x1, 2, 1.0, "latent")
    if bug == "source at the target's positions":  # image ids' first coordinate left 0
        monkeypatch.setattr(FluxKontextModel, "_context_ids", property(lambda self: self._img_ids.repeat(2, 1)))
    elif bug == "no source tokens":  # the text-to-image call: the context not joined at all
        monkeypatch.setattr(FluxKontextModel, "_transformer_forward",
                            lambda self, x, t, cond: self._flux_call(x, t, cond, self._img_ids))
    else:  # each row edited with the other row's source
        original = FluxKontextModel.encode
        monkeypatch.setattr(FluxKontextModel, "encode", lambda self, p, m=None: original(self, p, m[::-1]))
    x, _ = sample(model, x1, 2, 1.0)
    assert (x - expected).abs().max() > 1e-4


def test_encode_packs_the_pipelines_source_latents_and_reads_paths(model, pipe, tmp_path):
    from PIL import Image

    cond = model.encode(PROMPTS, METADATA)
    _, image_latents, _, image_ids = pipe.prepare_latents(
        pipe.image_processor.preprocess(torch.stack(SOURCES), R, R), 2, 4, R, R, torch.float32, "cpu")
    # the adapter encodes row by row, the pipeline the batch at once: equal to float rounding of the batched convolution
    torch.testing.assert_close(cond.tensors["image_latents"], image_latents, atol=1e-6, rtol=0)
    torch.testing.assert_close(model._context_ids[16:], image_ids, atol=0, rtol=0)
    # a file holds the same image (uint8 values): the same latents as the tensor of those values; cached per path
    pixels = (SOURCES[0] * 255).round().to(torch.uint8)
    Image.fromarray(pixels.permute(1, 2, 0).numpy()).save(tmp_path / "src.png")
    from_file = model.encode(PROMPTS[:1], [{SOURCE_IMAGE: str(tmp_path / "src.png")}]).tensors["image_latents"]
    from_tensor = model.encode(PROMPTS[:1], [{SOURCE_IMAGE: pixels.float() / 255}]).tensors["image_latents"]
    torch.testing.assert_close(from_file, from_tensor, atol=1e-6, rtol=0)
    (tmp_path / "src.png").unlink()  # served from the cache now
    assert torch.equal(model.encode(PROMPTS[:1], [{SOURCE_IMAGE: str(tmp_path / "src.png")}]).tensors[
        "image_latents"], from_file)
    # a source of another size is resized to the target's resolution
    assert model.encode(PROMPTS[:1], [{SOURCE_IMAGE: source(9, 2 * R)}]).tensors["image_latents"].shape == (1, 16, 16)


@pytest.mark.parametrize("metadata, message", [
    (None, r"flux_kontext prompt 'make the cat red': an edit model needs each prompt's source image in "
           r"metadata\['source_image'\]"),
    ([{SOURCE_IMAGE: "/nowhere/src.png"}], r"flux_kontext prompt 'make the cat red': source image '/nowhere/src.png' "
                                           "does not exist"),
    ([{SOURCE_IMAGE: torch.full((3, R, R), 2.0)}], r"values must lie in \[0, 1\], got \[2, 2\]"),
])
def test_a_missing_or_bad_source_is_one_line(model, metadata, message):
    with pytest.raises(ConfigError, match=message) as err:
        model.encode(PROMPTS[:1], metadata)
    assert "\n" not in str(err.value)


def test_lora_on_the_released_targets_and_reference_is_the_base(model, restore_lora):
    wrapped = {n.split(".lora_")[0] for n, _ in model.transformer.named_parameters() if "lora_" in n}
    assert wrapped and all(n.endswith(tuple("." + t for t in FLUX_LORA_TARGETS)) for n in wrapped)
    x = model.initial_noise([torch.Generator().manual_seed(5)])
    sigma, cond = torch.tensor([0.5]), model.encode(PROMPTS[:1], METADATA[:1])
    base = model.predict(x, sigma, cond)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(torch.randn_like(p) * 0.05)
    trained = model.predict(x, sigma, cond)
    assert trained.shape == x.shape and (trained - base).abs().max() > 1e-4
    with model.reference():
        assert torch.equal(model.predict(x, sigma, cond), base)


def test_the_exported_lora_loads_into_the_kontext_pipeline(kontext_dir, model, restore_lora, tmp_path):
    """``flowzoo export`` of a (hand-made, sealed) flux_kontext checkpoint: FluxKontextPipeline.load_lora_weights
    gives the transformer its LoRA's velocity."""
    import yaml
    from diffusers import FluxKontextPipeline
    from PIL import Image

    from flowzoo.benchmark.cli import main
    from flowzoo.benchmark.run.checkpoints import seal
    from flowzoo.benchmark.run.loading import load_config
    from flowzoo.io import atomic_torch_save

    Image.new("RGB", (R, R), (20, 200, 30)).save(tmp_path / "src.png")
    (tmp_path / "pairs.jsonl").write_text('{"prompt": "make it red", "image": "src.png"}\n')
    args = {"path": str(kontext_dir), **{k: v for k, v in ARGS.items()}}
    run = tmp_path / "run"
    run.mkdir()
    pairs = str(tmp_path / "pairs.jsonl")
    config = {"task": "tiny_kontext", "algorithm": {"name": "flow_grpo"},
              "model": {"name": "flux_kontext", "args": args}, "reward": "jpeg_compressibility", "train": {"steps": 2},
              "prompts": {"source": "files", "train": pairs, "test": pairs}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    torch.manual_seed(3)
    lora = {k: v + 0.05 * torch.randn_like(v) for k, v in model.trainable_state_dict().items()}  # "trained"
    model.load_trainable_state_dict(lora)
    state = {"step": 1, "algorithm": {"model": lora}, "rows": [{"step": 0}, {"step": 1}], "wall_s": 0.0, "nfe": 0}
    atomic_torch_save(seal(state, load_config(run / "config.yaml")), run / "checkpoint.pt")
    out = tmp_path / "lora"
    assert main(["export", str(run), "--out", str(out)]) == 0
    assert "FluxKontextPipeline.from_pretrained(BASE).load_lora_weights" in (out / "README.md").read_text()
    pipe = FluxKontextPipeline.from_pretrained(kontext_dir)
    pipe.load_lora_weights(out)
    x, sigma = torch.randn(1, *model.latent_shape), torch.tensor([0.7])
    cond = model.encode(["make it red"], [{SOURCE_IMAGE: str(tmp_path / "src.png")}])
    ours = model.transformer
    with torch.no_grad():
        expected = model.predict(x, sigma, cond)
        with model.reference():
            base = model.predict(x, sigma, cond)
        model.transformer = pipe.transformer  # the same call on diffusers' loaded weights
        try:
            got = model.predict(x, sigma, cond)
        finally:
            model.transformer = ours
    assert (got - expected).abs().max() < 1e-5 and (got - base).abs().max() > 1e-4


@pytest.mark.parametrize("algorithm", EVERY_ALGORITHM)
def test_every_algorithm_trains_a_step_on_edit_prompts(model, restore_lora, algorithm):
    from tests.adapter_training import check_training

    check_training(model, algorithm, PROMPTS, METADATA)


def test_op_grpo_replays_an_edit_with_its_own_source(model, restore_lora, monkeypatch):
    from tests.adapter_training import check_op_grpo_replays_edits

    check_op_grpo_replays_edits(model, METADATA, monkeypatch)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
@pytest.mark.skipif(os.environ.get("FLOWZOO_SCALE_MATRIX") != "full",
                    reason="a 2-process rehearsal of about a minute: make scale-check runs it (FLOWZOO_SCALE_MATRIX=full)")
def test_sharded_two_process_rehearsal(kontext_dir, tmp_path, monkeypatch):
    """tests/scale_rehearsal.py's rehearsal (sharded on 2 processes with the lockstep check, stopped and resumed on
    1, replicated, equal metrics, eval and export) of paper-flux-hpsv2's DanceGRPO recipe on the tiny Kontext
    pipeline, its prompts (image, instruction) pairs of a prompt file: the source images travel with the samples
    through the sharded rollouts, updates, checkpoint, resume and evaluation."""
    import yaml
    from PIL import Image

    from tests import scale_matrix, scale_rehearsal

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    pairs = tmp_path / "pairs"
    pairs.mkdir()
    for i, colour in enumerate([(200, 20, 20), (20, 200, 20), (20, 20, 200)]):
        Image.new("RGB", (R, R), colour).save(pairs / f"{i}.png")
    lines = [f'{{"prompt": "make it {word}", "image": "{i}.png"}}' for i, word in enumerate(["blue", "red", "red"])]
    for split in ("train", "test"):
        (pairs / f"{split}_metadata.jsonl").write_text("\n".join(lines) + "\n")
    with scale_matrix.half_constant_reward():
        config = dict(scale_rehearsal.cells("paper-flux-hpsv2", tmp_path))["dance_grpo"]
        data = yaml.safe_load(config.read_text())
        data["model"]["name"] = "flux_kontext"
        data["model"]["args"]["path"] = str(kontext_dir)
        data["prompts"].update(train=str(pairs), test=str(pairs))
        config.write_text(yaml.safe_dump(data, sort_keys=False))
        problems = scale_rehearsal.rehearse(config, tmp_path / "dance_grpo")
    assert not problems, "\n".join(problems)
