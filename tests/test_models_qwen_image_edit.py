"""The qwen_image_edit adapter on a tiny random QwenImageEditPipeline (the qwen_image tests' components, the Qwen2.5-VL
text encoder with a 1-block vision tower, a small Qwen2VLImageProcessor) built in code, saved and loaded through the
adapter's real ``from_pretrained`` path: a sample from the same noise and source image equals the pipeline's (with
and without true CFG), planted bugs fail that, the LoRA exports for ``load_lora_weights``, every algorithm trains a
step on edit prompts, and (make scale-check) the sharded 2-process rehearsal runs on edit pairs.

The pipeline resizes every source to about 1 megapixel (``calculate_dimensions``); the adapter resizes it to the
target's resolution. The parity tests point the pipeline's ``calculate_dimensions`` at the target's size, where the
two agree (docs/models.md)."""

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
from flowzoo.models.qwen_image import QWEN_IMAGE_LORA_TARGETS  # noqa: E402
from flowzoo.models.qwen_image_edit import QwenImageEditModel  # noqa: E402
from flowzoo.source_images import SOURCE_IMAGE  # noqa: E402
from tests.adapter_training import EVERY_ALGORITHM  # noqa: E402
from tests.tiny_pipelines import QWEN_EDIT_MAX_SEQ, QWEN_RESOLUTION, build_tiny_qwen_image_edit  # noqa: E402

R = QWEN_RESOLUTION
PROMPTS = ["make the cat red", "add a dog"]  # different lengths: the adapter's batch pads the shorter one
ARGS = dict(resolution=R, max_sequence_length=QWEN_EDIT_MAX_SEQ, lora_rank=4, lora_alpha=8, device="cpu")


def source(seed: int, size: int = R) -> torch.Tensor:
    """A random source image [3, size, size] in [0, 1], on the 8-bit grid (a file holds the same values)."""
    return (torch.rand(3, size, size, generator=torch.Generator().manual_seed(seed)) * 255).round() / 255


def pil(image: torch.Tensor):
    from PIL import Image

    return Image.fromarray((image * 255).round().to(torch.uint8).permute(1, 2, 0).numpy())


SOURCES = [source(7), source(8)]


@pytest.fixture(scope="session")
def edit_dir(tmp_path_factory):
    return build_tiny_qwen_image_edit(tmp_path_factory.mktemp("tiny_qwen_image_edit"))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The sources as PNG files: the prompts' metadata (paths, what the prompt sources give)."""
    folder = tmp_path_factory.mktemp("edit_sources")
    for i, image in enumerate(SOURCES):
        pil(image).save(folder / f"{i}.png")
    return [{SOURCE_IMAGE: str(folder / f"{i}.png")} for i in range(len(SOURCES))]


@pytest.fixture(scope="module")
def model(edit_dir):
    return QwenImageEditModel(path=edit_dir, **ARGS)


@pytest.fixture(scope="module")
def pipe(edit_dir, model):
    from diffusers import QwenImageEditPipeline

    # the adapter's processor (transformers builds no Qwen2VLProcessor without torchvision)
    pipe = QwenImageEditPipeline.from_pretrained(edit_dir, processor=model.pipe.processor)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture
def at_target_size(monkeypatch):
    """The pipeline's source size pointed at the target's (it resizes every source to ~1 MP)."""
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit as edit

    monkeypatch.setattr(edit, "calculate_dimensions", lambda area, ratio: (R, R, None))


def pipeline_call(pipe, x1, steps, true_cfg, output_type):
    """QwenImageEditPipeline on each row's noise and source (it takes one source image per call)."""
    out = []
    for i, prompt in enumerate(PROMPTS):
        kwargs = dict(image=pil(SOURCES[i]), prompt=prompt, height=R, width=R, num_inference_steps=steps)
        if true_cfg != 1.0:
            kwargs.update(negative_prompt=" ", true_cfg_scale=true_cfg)
        out.append(pipe(latents=x1[i: i + 1].clone(), output_type=output_type, **kwargs).images)
    return torch.cat(out)


def sample(model, x1, steps, true_cfg, metadata):
    sigmas = sigma_schedule(steps, model.default_shift, grid=model.default_sigma_grid, terminal=model.shift_terminal)
    cond, x = model.encode(PROMPTS[: len(x1)], metadata), x1
    with torch.no_grad():
        for s, s_next in zip(sigmas[:-1], sigmas[1:]):
            x = x + model.velocity(x, torch.full((len(x1),), float(s)), cond, true_cfg) * (s_next - s)
    return x, sigmas


def test_registered_with_the_target_tokens_schedule(model):
    assert models.get("qwen_image_edit") is QwenImageEditModel and model.sample_kind == "image"
    assert model.lora_format == "QwenImageEditPipeline" and model.default_lora_targets == QWEN_IMAGE_LORA_TARGETS
    assert model.default_guidance == 4.0 and model.negative_prompt == " " and model.shift_terminal == 0.02
    assert model.latent_shape == (4, 16)  # the target's tokens only; the source's ride in the condition
    # 4 target tokens (the source's do not count), on Qwen-Image's line
    assert model.default_shift == pytest.approx(math.exp(0.5 + 0.4 / 7936 * (4 - 256)), rel=1e-12)
    fp = QwenImageEditModel.footprint({"resolution": 512, "max_sequence_length": 512})
    qwen = models.get("qwen_image").footprint({"resolution": 512, "max_sequence_length": 512})
    assert fp.tokens == qwen.tokens + 32 * 32 and fp.arch.transformer_params == qwen.arch.transformer_params


@pytest.mark.parametrize("true_cfg", [1.0, 4.0])
def test_a_sample_and_its_pixels_reproduce_the_pipeline(model, pipe, files, at_target_size, true_cfg):
    """Latents to 1e-5 and pixels to 1e-6: the adapter's batch pads the shorter prompt (masked, trimmed to the longer)
    where the pipeline encodes each alone, which moves the latents by float rounding (1.7e-6 measured); a row alone
    agrees to 1e-6."""
    steps = 3
    x1 = model.initial_noise([torch.Generator().manual_seed(s) for s in (1, 2)])
    nfe = model.nfe
    x, sigmas = sample(model, x1, steps, true_cfg, files)
    assert model.nfe - nfe == steps * 2 * (2 if true_cfg != 1.0 else 1)
    expected = pipeline_call(pipe, x1, steps, true_cfg, "latent")
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas, atol=1e-6, rtol=0)  # the shift of the target tokens
    assert (x - x1).abs().max() > 1e-2
    torch.testing.assert_close(x, expected, atol=1e-5, rtol=0)
    alone, _ = sample(model, x1[:1], steps, true_cfg, files[:1])
    torch.testing.assert_close(alone, expected[:1], atol=1e-6, rtol=0)
    images = pipeline_call(pipe, x1, steps, true_cfg, "pt")
    decoded = model.decode(x)
    assert decoded.shape == (2, 3, R, R) and 0 <= decoded.min() <= decoded.max() <= 1
    torch.testing.assert_close(decoded, images, atol=1e-6, rtol=0)


@pytest.mark.parametrize("bug", ["no source tokens", "prompt read without the source", "other rows' sources"])
def test_a_planted_bug_fails_the_parity(model, pipe, files, at_target_size, monkeypatch, bug):
    from flowzoo.models.qwen_image import QwenImageModel

    x1 = model.initial_noise([torch.Generator().manual_seed(s) for s in (1, 2)])
    expected = pipeline_call(pipe, x1, 2, 4.0, "latent")
    model.__dict__.pop("_source_cache", None)
    if bug == "no source tokens":  # Qwen-Image's text-to-image call: no image latents, the target's grid alone
        monkeypatch.setattr(QwenImageEditModel, "_transformer_forward", QwenImageModel._transformer_forward)
        monkeypatch.setattr(QwenImageEditModel, "_img_shapes", QwenImageModel._img_shapes)
    elif bug == "prompt read without the source":  # the VL encoder given a blank image of the same size
        blank = {SOURCE_IMAGE: torch.zeros(3, R, R)}
        original = QwenImageEditModel._vl_prompt
        monkeypatch.setattr(QwenImageEditModel, "_vl_prompt", lambda self, p, m: original(self, p, blank))
    else:  # each row's image latents from the other row's source
        original = QwenImageEditModel._source_latents
        swapped = {f[SOURCE_IMAGE]: g for f, g in zip(files, files[::-1])}
        monkeypatch.setattr(QwenImageEditModel, "_source_latents",
                            lambda self, p, m: original(self, p, swapped[m[SOURCE_IMAGE]]))
    try:
        x, _ = sample(model, x1, 2, 4.0, files)
    finally:
        model.__dict__.pop("_source_cache", None)
    assert (x - expected).abs().max() > 1e-4


def test_encode_reads_the_prompt_with_its_image_and_keeps_the_negative(model, pipe, files, tmp_path, monkeypatch):
    cond = model.encode(PROMPTS, files)
    mask = cond.tensors["prompt_embeds_mask"]
    assert cond.tensors["prompt_embeds"].shape == (2, QWEN_EDIT_MAX_SEQ, 16)
    for i, prompt in enumerate(PROMPTS):
        for text, key in ((prompt, "prompt_embeds"), (" ", "negative_prompt_embeds")):
            embeds, _ = pipe.encode_prompt(text, image=pil(SOURCES[i]))  # the template with the image, drop_idx 64
            width = embeds.shape[1]
            torch.testing.assert_close(cond.tensors[key][i, :width], embeds[0], atol=1e-6, rtol=0)
            assert cond.tensors[key + "_mask"][i, :width].all() and not cond.tensors[key + "_mask"][i, width:].any()
    assert mask.sum(1)[0] > mask.sum(1)[1]  # the longer instruction
    # the image's 4 tokens are read: another source changes the embeddings of the same instruction
    other = model.encode(PROMPTS[:1], [{SOURCE_IMAGE: source(9)}]).tensors["prompt_embeds"]
    assert (other - cond.tensors["prompt_embeds"][:1]).abs().max() > 1e-3
    # CFG's branch: the negative read with each row's own image, the same image latents
    null = model.unconditional(cond)
    assert torch.equal(null.tensors["prompt_embeds"], cond.tensors["negative_prompt_embeds"])
    assert torch.equal(null.tensors["image_latents"], cond.tensors["image_latents"])
    assert not torch.equal(null.tensors["prompt_embeds"][0], null.tensors["prompt_embeds"][1])
    # the source's latents: the pipeline's prepare_latents on the same image
    pixels = pipe.image_processor.preprocess(pil(SOURCES[0]), R, R).unsqueeze(2)
    _, image_latents = pipe.prepare_latents(pixels, 1, 4, R, R, torch.float32, "cpu", None)
    torch.testing.assert_close(cond.tensors["image_latents"][:1], image_latents, atol=1e-6, rtol=0)
    # a tensor of the file's values: the same condition; a cached path is not read again
    from_tensor = model.encode(PROMPTS[:1], [{SOURCE_IMAGE: SOURCES[0]}])
    for key, value in from_tensor.tensors.items():
        torch.testing.assert_close(value, cond.tensors[key][:1], atol=1e-6, rtol=0)

    def boom(*args, **kwargs):
        raise AssertionError("the text encoder ran for a cached (path, prompt)")

    monkeypatch.setattr(model.pipe.text_encoder, "forward", boom)
    assert torch.equal(model.encode(PROMPTS[:1], files[:1]).tensors["prompt_embeds"], cond.tensors["prompt_embeds"][:1])
    with pytest.raises(ConfigError, match="qwen_image_edit has no condition without a source image"):
        model.null_condition(1)


@pytest.mark.parametrize("metadata, message", [
    (None, r"qwen_image_edit prompt 'make the cat red': an edit model needs each prompt's source image in "
           r"metadata\['source_image'\]"),
    ([{SOURCE_IMAGE: "/nowhere/src.png"}], r"source image '/nowhere/src.png' does not exist"),
])
def test_a_missing_source_or_a_long_prompt_is_one_line(edit_dir, model, metadata, message):
    with pytest.raises(ConfigError, match=message) as err:
        model.encode(PROMPTS[:1], metadata)
    assert "\n" not in str(err.value)
    short = QwenImageEditModel(path=edit_dir, **{**ARGS, "max_sequence_length": 64})
    with pytest.raises(ConfigError, match=r"with its source image is \d+ tokens, over max_sequence_length 64"):
        short.encode(PROMPTS[:1], [{SOURCE_IMAGE: SOURCES[0]}])


def test_lora_on_the_released_targets_and_reference_is_the_base(model, files, restore_lora):
    wrapped = {n.split(".lora_")[0] for n, _ in model.transformer.named_parameters() if "lora_" in n}
    assert len(wrapped) == len(QWEN_IMAGE_LORA_TARGETS)
    x = model.initial_noise([torch.Generator().manual_seed(5)])
    sigma, cond = torch.tensor([0.5]), model.encode(PROMPTS[:1], files[:1])
    base = model.predict(x, sigma, cond)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(torch.randn_like(p) * 0.05)
    trained = model.predict(x, sigma, cond)
    assert trained.shape == x.shape and (trained - base).abs().max() > 1e-4
    with model.reference():
        assert torch.equal(model.predict(x, sigma, cond), base)


def test_the_exported_lora_loads_into_the_edit_pipeline(edit_dir, model, files, restore_lora, tmp_path):
    """``flowzoo export`` of a (hand-made, sealed) qwen_image_edit checkpoint: QwenImageEditPipeline's
    load_lora_weights gives the transformer its LoRA's velocity."""
    import yaml
    from diffusers import QwenImageEditPipeline

    from flowzoo.benchmark.cli import main
    from flowzoo.benchmark.run.checkpoints import seal
    from flowzoo.benchmark.run.loading import load_config
    from flowzoo.io import atomic_torch_save

    pil(SOURCES[0]).save(tmp_path / "src.png")
    (tmp_path / "pairs.jsonl").write_text('{"prompt": "make it red", "image": "src.png"}\n')
    run = tmp_path / "run"
    run.mkdir()
    pairs = str(tmp_path / "pairs.jsonl")
    config = {"task": "tiny_qwen_edit", "algorithm": {"name": "flow_grpo"},
              "model": {"name": "qwen_image_edit", "args": {"path": str(edit_dir), **ARGS}},
              "reward": "jpeg_compressibility", "train": {"steps": 2},
              "prompts": {"source": "files", "train": pairs, "test": pairs}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    torch.manual_seed(3)
    lora = {k: v + 0.05 * torch.randn_like(v) for k, v in model.trainable_state_dict().items()}  # "trained"
    model.load_trainable_state_dict(lora)
    state = {"step": 1, "algorithm": {"model": lora}, "rows": [{"step": 0}, {"step": 1}], "wall_s": 0.0, "nfe": 0}
    atomic_torch_save(seal(state, load_config(run / "config.yaml")), run / "checkpoint.pt")
    out = tmp_path / "lora"
    assert main(["export", str(run), "--out", str(out)]) == 0
    assert "QwenImageEditPipeline.from_pretrained(BASE).load_lora_weights" in (out / "README.md").read_text()
    pipe = QwenImageEditPipeline.from_pretrained(edit_dir, processor=model.pipe.processor)
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

    check_training(model, algorithm, PROMPTS, [{SOURCE_IMAGE: s} for s in SOURCES])



def test_op_grpo_replays_an_edit_with_its_own_source(model, restore_lora, monkeypatch):
    from tests.adapter_training import check_op_grpo_replays_edits

    check_op_grpo_replays_edits(model, [{SOURCE_IMAGE: s} for s in SOURCES], monkeypatch)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
@pytest.mark.skipif(os.environ.get("FLOWZOO_SCALE_MATRIX") != "full",
                    reason="a 2-process rehearsal of about a minute: make scale-check runs it (FLOWZOO_SCALE_MATRIX=full)")
def test_sharded_two_process_rehearsal(edit_dir, tmp_path, monkeypatch):
    """tests/scale_rehearsal.py's rehearsal (sharded on 2 processes with the lockstep check, stopped and resumed on
    1, replicated, equal metrics, eval and export) of paper-qwen-image-pickscore's Flow-GRPO-Fast recipe on the tiny
    edit pipeline, its prompts (image, instruction) pairs of a prompt file: the source images travel with the samples
    through the sharded rollouts, updates, checkpoint, resume and evaluation."""
    import yaml

    from tests import scale_matrix, scale_rehearsal

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    pairs = tmp_path / "pairs"
    pairs.mkdir()
    for i, seed in enumerate((11, 12, 13)):
        pil(source(seed)).save(pairs / f"{i}.png")
    lines = [f'{{"prompt": "make it {word}", "image": "{i}.png"}}' for i, word in enumerate(["blue", "red", "red"])]
    for split in ("train", "test"):
        (pairs / f"{split}_metadata.jsonl").write_text("\n".join(lines) + "\n")
    with scale_matrix.half_constant_reward():
        config = dict(scale_rehearsal.cells("paper-qwen-image-pickscore", tmp_path))["flow_grpo_fast"]
        data = yaml.safe_load(config.read_text())
        data["model"]["name"] = "qwen_image_edit"
        data["model"]["args"].update(path=str(edit_dir), max_sequence_length=QWEN_EDIT_MAX_SEQ)
        data["prompts"].update(train=str(pairs), test=str(pairs))
        config.write_text(yaml.safe_dump(data, sort_keys=False))
        problems = scale_rehearsal.rehearse(config, tmp_path / "flow_grpo_fast")
    assert not problems, "\n".join(problems)


def test_transformer_calls_read_no_mask_with_the_host_lengths(model, pipe, files, at_target_size, restore_lora,
                                                               monkeypatch):
    """The instruction's and the negative prompt's valid lengths are read once when a row is encoded and ride on the
    condition's host values (the negative's become the text lengths of CFG's branch), so sampling with true CFG and a
    training step never read a mask from the device per transformer call; the sample still reproduces the pipeline."""
    from flowzoo.models.qwen_image import QwenImageModel
    from tests.adapter_training import check_training

    cond = model.encode(PROMPTS, files)
    assert cond.host["text_length"] == tuple(cond.tensors["prompt_embeds_mask"].sum(dim=1).tolist())
    assert cond.host["negative_text_length"] == tuple(cond.tensors["negative_prompt_embeds_mask"].sum(dim=1).tolist())
    assert model.unconditional(cond).host == {"text_length": cond.host["negative_text_length"]}

    def no_read(mask):
        raise AssertionError("a transformer call read the mask from the device")

    monkeypatch.setattr(QwenImageModel, "_read_text_length", staticmethod(no_read))
    x1 = model.initial_noise([torch.Generator().manual_seed(s) for s in (1, 2)])
    x, _ = sample(model, x1, 2, 4.0, files)
    torch.testing.assert_close(x, pipeline_call(pipe, x1, 2, 4.0, "latent"), atol=1e-5, rtol=0)
    check_training(model, "op_grpo", PROMPTS, [{SOURCE_IMAGE: s} for s in SOURCES])
