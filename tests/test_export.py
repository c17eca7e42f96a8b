"""``flowzoo export``: a run's trained LoRA loads into a fresh diffusers pipeline with ``load_lora_weights`` and
gives the transformer the run's trained outputs; bad input is one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from flowzoo.benchmark.cli import main  # noqa: E402
from flowzoo.benchmark.run.export_lora import WEIGHTS_NAME  # noqa: E402
from flowzoo.models.sd3 import SD3Model  # noqa: E402
from tests.test_models_sd3 import MAX_SEQ, RESOLUTION, build_tiny_sd3  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["a photo of a cat", "two red dogs"]
MODEL_ARGS = {"resolution": RESOLUTION, "max_sequence_length": MAX_SEQ, "lora_rank": 4, "lora_alpha": 8,
              "device": "cpu"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 1-step Flow-GRPO run of the project on a tiny random SD3 pipeline: (pipeline dir, run dir)."""
    tmp = tmp_path_factory.mktemp("export")
    sd3_dir = build_tiny_sd3(tmp / "sd3", tmp_path_factory.mktemp("tok"))
    for split in ("train", "test"):
        (tmp / f"{split}.txt").write_text("\n".join(PROMPTS) + "\n")
    config = {
        "task": "tiny_sd3", "seed": 0,
        "algorithm": {"name": "flow_grpo", "group_size": 2, "num_steps": 2, "lr": 0.05, "kl_beta": 0.0},
        "model": {"name": "sd3", "args": {"path": str(sd3_dir), **MODEL_ARGS}},
        "reward": "jpeg_compressibility",
        "prompts": {"source": "files", "train": str(tmp / "train.txt"), "test": str(tmp / "test.txt")},
        "train": {"steps": 1, "prompts_per_step": 2, "eval_every": 1, "eval_samples_per_prompt": 1,
                  "save_samples": False},
        "run_dir": str(tmp / "run"),
        "use_recipe": False,  # the export's mechanics on a 1-step run: not the SD3 recipe (EMA every 8 steps)
    }
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["train", str(tmp / "config.yaml"), "--quiet"]) == 0
    return sd3_dir, tmp / "run"


def test_exported_lora_loads_into_diffusers_with_the_trained_outputs(trained, tmp_path):
    from diffusers import StableDiffusion3Pipeline

    sd3_dir, run_dir = trained
    out = tmp_path / "lora"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    assert (out / WEIGHTS_NAME).is_file() and "flow_grpo" in (out / "README.md").read_text()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no staging left behind

    ours = SD3Model(path=sd3_dir, **MODEL_ARGS)  # the project's model with the run's trained LoRA
    trained_lora = torch.load(run_dir / "checkpoint.pt", weights_only=False)["algorithm"]["model"]
    ours.load_trainable_state_dict(trained_lora)
    assert any((v - ours.trainable_state_dict()[k]).abs().max() > 0 for k, v in
               SD3Model(path=sd3_dir, **MODEL_ARGS).trainable_state_dict().items())  # training changed the LoRA

    torch.manual_seed(1)
    x = torch.randn(2, *ours.latent_shape)
    sigma = torch.tensor([0.9, 0.4])
    cond = ours.encode(PROMPTS)
    with torch.no_grad():
        expected = ours.predict(x, sigma, cond)
        with ours.reference():
            base = ours.predict(x, sigma, cond)

    pipe = StableDiffusion3Pipeline.from_pretrained(sd3_dir)
    pipe.load_lora_weights(out)
    with torch.no_grad():
        got = pipe.transformer(hidden_states=x, timestep=sigma * 1000, encoder_hidden_states=cond.tensors[
            "prompt_embeds"], pooled_projections=cond.tensors["pooled_prompt_embeds"], return_dict=False)[0]
    assert (got - expected).abs().max() < 1e-5
    assert (got - base).abs().max() > 1e-3  # the LoRA is applied (and its scale alpha/r = 2 with it)


@pytest.mark.parametrize("make, message", [
    (lambda tmp, run: tmp / "nowhere", "does not exist"),
    (lambda tmp, run: tmp, "has no config.yaml"),
])
def test_bad_run_dir_is_one_line(make, message, trained, tmp_path, capsys):
    assert main(["export", str(make(tmp_path, trained[1])), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_run_without_checkpoint_is_one_line(trained, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text((trained[1] / "config.yaml").read_text())
    assert main(["export", str(run), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no checkpoint.pt" in err and len(err.splitlines()) == 1 and not (tmp_path / "o").exists()


def test_toy_run_is_one_line(tmp_path, capsys):
    run = tmp_path / "toy"
    config = yaml.safe_load((ROOT / "benchmark" / "configs" / "toy_flow_grpo.yaml").read_text())
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["export", str(run), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "'toy2d' run" in err and "trains no LoRA" in err and len(err.splitlines()) == 1


def test_tiny_run_exports_in_the_sd3_layout(tmp_path):
    """A tiny-tier run (no diffusers pipeline): its export loads with ``load_lora_adapter`` into the base
    transformer and gives the trained velocity."""
    from flowzoo.models.tiny import TinyModel, build_networks, load_networks, read_weights, transformer_velocity

    run, out = tmp_path / "run", tmp_path / "lora"
    config = ROOT / "benchmark" / "configs" / "tiny_flow_grpo.yaml"
    assert main(["train", str(config), "train.steps=1", "train.prompts_per_step=2", "algorithm.group_size=2",
                 "algorithm.lr=0.05", "train.eval_prompts=2", "train.eval_every=1", f"run_dir={run}", "--quiet"]) == 0
    assert main(["export", str(run), "--out", str(out)]) == 0
    assert (out / WEIGHTS_NAME).stat().st_mode & 0o044  # readable by others, as open() would write it

    ours = TinyModel(data="shapes")
    ours.load_trainable_state_dict(torch.load(run / "checkpoint.pt", weights_only=False)["algorithm"]["model"])
    arch, tensors, _ = read_weights(ours.path)
    _, text_encoder, transformer = build_networks(arch)
    load_networks(transformer, text_encoder, tensors)
    transformer.load_lora_adapter(out, weight_name=WEIGHTS_NAME, prefix="transformer")

    torch.manual_seed(2)
    x = torch.randn(2, *ours.latent_shape)
    sigma = torch.tensor([0.8, 0.3])
    cond = ours.encode(["a red circle", "two blue squares"])
    with torch.no_grad():
        expected = ours.predict(x, sigma, cond)
        with ours.reference():
            base = ours.predict(x, sigma, cond)
        got = transformer_velocity(transformer.eval(), x, sigma * 1000, cond.tensors)
    assert (got - expected).abs().max() < 1e-5
    assert (got - base).abs().max() > 1e-4


def test_wan_checkpoint_exports_for_wan_pipeline(tmp_path):
    """A (hand-made, sealed) checkpoint of a wan run: WanPipeline.load_lora_weights gives its LoRA's velocity."""
    from diffusers import WanPipeline

    from flowzoo.benchmark.run.checkpoints import seal
    from flowzoo.benchmark.run.loading import load_config
    from flowzoo.io import atomic_torch_save
    from flowzoo.models.wan import WanModel
    from tests.test_models_wan import FRAMES, HEIGHT, WIDTH, build_tiny_wan

    wan_dir = build_tiny_wan(tmp_path / "wan")
    args = {"path": str(wan_dir), "frames": FRAMES, "height": HEIGHT, "width": WIDTH, "max_sequence_length": 8,
            "lora_rank": 4, "lora_alpha": 8, "device": "cpu"}
    (tmp_path / "p.txt").write_text("a cat walks\n")
    run = tmp_path / "run"
    run.mkdir()
    config = {"task": "tiny_wan", "algorithm": {"name": "flow_grpo"}, "model": {"name": "wan", "args": args},
              "reward": "video_ocr", "train": {"steps": 2},
              "prompts": {"source": "files", "train": str(tmp_path / "p.txt"), "test": str(tmp_path / "p.txt")}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    ours = WanModel(**args)
    torch.manual_seed(3)
    lora = {k: v + 0.05 * torch.randn_like(v) for k, v in ours.trainable_state_dict().items()}  # "trained"
    ours.load_trainable_state_dict(lora)
    state = {"step": 1, "algorithm": {"model": lora}, "rows": [{"step": 0}, {"step": 1}], "wall_s": 0.0, "nfe": 0}
    atomic_torch_save(seal(state, load_config(run / "config.yaml")), run / "checkpoint.pt")

    out = tmp_path / "lora"
    assert main(["export", str(run), "--out", str(out)]) == 0
    assert "unfinished run, step 1 of 2" in (out / "README.md").read_text()
    x = torch.randn(1, *ours.latent_shape)
    sigma = torch.tensor([0.7])
    cond = ours.encode(["a cat walks"])
    pipe = WanPipeline.from_pretrained(wan_dir)
    pipe.load_lora_weights(out)
    with torch.no_grad():
        expected = ours.predict(x, sigma, cond)
        with ours.reference():
            base = ours.predict(x, sigma, cond)
        got = pipe.transformer(hidden_states=x, timestep=sigma * 1000, encoder_hidden_states=cond.tensors[
            "prompt_embeds"], return_dict=False)[0]
    assert (got - expected).abs().max() < 1e-5
    assert (got - base).abs().max() > 1e-4


@pytest.mark.parametrize("name", ["flux", "qwen_image"])
def test_flux_and_qwen_image_checkpoints_export_for_their_pipelines(tmp_path, name):
    """A (hand-made, sealed) checkpoint of a flux / qwen_image run: FluxPipeline / QwenImagePipeline
    .load_lora_weights gives the transformer its LoRA's velocity."""
    import diffusers

    from flowzoo import models
    from flowzoo.benchmark.run.checkpoints import seal
    from flowzoo.benchmark.run.loading import load_config
    from flowzoo.io import atomic_torch_save
    from tests import tiny_pipelines as tiny

    if name == "flux":
        (tmp_path / "tok").mkdir()
        base = tiny.build_tiny_flux(tmp_path / "base", tmp_path / "tok")
        size = {"resolution": tiny.FLUX_RESOLUTION, "max_sequence_length": tiny.FLUX_MAX_SEQ}
    else:
        base = tiny.build_tiny_qwen_image(tmp_path / "base")
        size = {"resolution": tiny.QWEN_RESOLUTION, "max_sequence_length": tiny.QWEN_MAX_SEQ}
    args = {"path": str(base), **size, "lora_rank": 4, "lora_alpha": 8, "device": "cpu"}
    (tmp_path / "p.txt").write_text("a photo of a cat\n")
    run = tmp_path / "run"
    run.mkdir()
    config = {"task": f"tiny_{name}", "algorithm": {"name": "dance_grpo"}, "model": {"name": name, "args": args},
              "reward": "jpeg_compressibility", "train": {"steps": 2},
              "prompts": {"source": "files", "train": str(tmp_path / "p.txt"), "test": str(tmp_path / "p.txt")}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    ours = models.get(name)(**args)
    torch.manual_seed(3)
    lora = {k: v + 0.05 * torch.randn_like(v) for k, v in ours.trainable_state_dict().items()}  # "trained"
    ours.load_trainable_state_dict(lora)
    state = {"step": 1, "algorithm": {"model": lora}, "rows": [{"step": 0}, {"step": 1}], "wall_s": 0.0, "nfe": 0}
    atomic_torch_save(seal(state, load_config(run / "config.yaml")), run / "checkpoint.pt")

    out = tmp_path / "lora"
    assert main(["export", str(run), "--out", str(out)]) == 0
    pipeline = {"flux": "FluxPipeline", "qwen_image": "QwenImagePipeline"}[name]
    assert f"{pipeline}.from_pretrained(BASE).load_lora_weights" in (out / "README.md").read_text()
    pipe = getattr(diffusers, pipeline).from_pretrained(base)
    pipe.load_lora_weights(out)
    ours.transformer, transformer = pipe.transformer, ours.transformer  # the same call on diffusers' loaded weights
    x, sigma, cond = torch.randn(1, *ours.latent_shape), torch.tensor([0.7]), ours.encode(["a photo of a cat"])
    with torch.no_grad():
        got = ours.predict(x, sigma, cond)
        ours.transformer = transformer
        expected = ours.predict(x, sigma, cond)
        with ours.reference():
            base_v = ours.predict(x, sigma, cond)
    assert (got - expected).abs().max() < 1e-5
    assert (got - base_v).abs().max() > 1e-4
