"""The tiny edit tier on small random arches: the source image concatenated to the noisy image (and kept by CFG's
unconditional branch), training steps of Flow-GRPO and OP-GRPO on ``tiny_edit`` prompts (the replay buffer replays an
edit with its own source), pretraining from text-to-image weights (``--init``: at step 0 exactly the text-to-image
model) that resumes exactly, the ``tiny_edit`` prompt source and config, and one-line errors for bad inputs."""

import json

import pytest
import torch

from flowzoo import models
from flowzoo.errors import ConfigError
from flowzoo.models import tiny
from flowzoo.models.tiny import read_weights, save_weights
from flowzoo.models.tiny_edit import PATCH_WEIGHT, SOURCE, TOKEN_EMBEDDING
from flowzoo.models.tiny_edit_data import EDIT_KINDS, edit_prompt_set
from flowzoo.source_images import SOURCE_IMAGE

SMALL = dict(layers=1, heads=2, head_dim=8, text_width=16, text_layers=1, text_heads=2)
CONFIG = "benchmark/configs/tiny_edit_flow_grpo.yaml"
#: the smallest run of the config: a random model of SMALL, 2 steps of 2 prompts x G 2, 4 evaluation prompts
SMALL_RUN = ["model.args.weights=null",
             "model.args.arch={layers: 1, heads: 2, head_dim: 8, text_width: 16, text_layers: 1, text_heads: 2}",
             "algorithm.num_steps=2", "algorithm.group_size=2", "train.steps=2", "train.prompts_per_step=2",
             "train.eval_prompts=4", "train.eval_every=1", "train.checkpoint_every=1", "train.save_samples=false"]


@pytest.fixture
def model():
    return models.get("tiny_edit")(weights=None, arch=SMALL, lora_rank=2, lora_alpha=4)


@pytest.fixture(scope="module")
def edits():
    prompts = edit_prompt_set(2, seed=1)
    return [p for p, _ in prompts], [m for _, m in prompts]


def _one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message, message
    return message


def _text_to_image_file(path, seed=3):
    """A random tiny text-to-image model of SMALL saved as a weights file."""
    t2i = models.get("tiny")(weights=None, arch=SMALL, lora_rank=2, seed=seed)
    save_weights(path, t2i.arch, t2i.transformer, t2i.text_encoder)
    return path


# ---- the model ---------------------------------------------------------------------------------------------------
def test_the_source_is_concatenated_and_cfg_keeps_it(model, edits):
    prompts, metadata = edits
    assert model.transformer.config.in_channels == 6 and model.transformer.config.out_channels == 3
    cond = model.encode(prompts, metadata)
    source = cond.tensors[SOURCE]
    assert source.shape == (2, 3, 32, 32) and torch.equal(source, torch.stack([m[SOURCE_IMAGE] for m in metadata]) * 2 - 1)
    x, sigma = torch.randn(2, *model.latent_shape), torch.tensor([0.8, 0.4])
    swapped = model.encode(prompts, metadata[::-1])  # the same instructions on each other's sources
    with torch.no_grad():
        v = model.predict(x, sigma, cond)
        assert v.shape == x.shape and not torch.allclose(v, model.predict(x, sigma, swapped), atol=1e-4)
        uncond = model.unconditional(cond)
        assert torch.equal(uncond.tensors[SOURCE], source)  # CFG's branch: the empty instruction, the same source
        assert torch.equal(uncond.tensors["prompt_embeds"], model.null_condition(2).tensors["prompt_embeds"])
        v_uncond = model.predict(x, sigma, uncond)
        assert not torch.allclose(v_uncond, model.predict(x, sigma, model.unconditional(swapped)), atol=1e-4)
        model.nfe = 0
        guided = model.velocity(x, sigma, cond, guidance=3.0)
    assert model.nfe == 4 and torch.allclose(guided, v_uncond + 3.0 * (v - v_uncond), atol=1e-5)


def test_a_file_source_is_read_and_resized(model, edits, tmp_path):
    from PIL import Image

    prompts, metadata = edits
    pixels = (metadata[0][SOURCE_IMAGE].permute(1, 2, 0).numpy() * 255).round().astype("uint8")
    Image.fromarray(pixels).save(tmp_path / "s.png")
    Image.fromarray(pixels).resize((64, 64), Image.NEAREST).save(tmp_path / "big.png")
    from_tensor = model.encode(prompts[:1], metadata[:1]).tensors[SOURCE]
    for name in ("s.png", "big.png"):
        from_file = model.encode(prompts[:1], [{SOURCE_IMAGE: str(tmp_path / name)}]).tensors[SOURCE]
        assert from_file.shape == (1, 3, 32, 32) and (from_file - from_tensor).abs().mean() < 0.02


def test_bad_inputs_are_one_line_config_errors(model, edits, tmp_path, monkeypatch):
    prompts, metadata = edits
    with pytest.raises(ConfigError) as err:
        model.encode(["remove the circle"])
    assert "tiny_edit prompt 'remove the circle'" in _one_line(err) and "source image" in str(err.value)
    with pytest.raises(ConfigError) as err:
        model.encode(prompts[:1], [{SOURCE_IMAGE: torch.rand(1, 32, 32)}])
    assert "1 channels, not 3" in _one_line(err)
    monkeypatch.setattr(tiny, "WEIGHTS_DIR", tmp_path)  # no edit weights there, whether or not they are shipped
    with pytest.raises(ConfigError) as err:
        models.get("tiny_edit")()
    assert ("flowzoo pretrain tiny --data shapes_edit --init models/weights/tiny_shapes.safetensors"
            in _one_line(err))
    t2i = _text_to_image_file(tmp_path / "t2i.safetensors")
    with pytest.raises(ConfigError) as err:
        models.get("tiny_edit")(weights=str(t2i))
    assert "holds a text-to-image model" in _one_line(err) and "use model 'tiny'" in str(err.value)
    edit_file = tmp_path / "edit.safetensors"
    save_weights(edit_file, model.arch, model.transformer, model.text_encoder)
    with pytest.raises(ConfigError) as err:
        models.get("tiny")(weights=str(edit_file))
    assert "holds an edit model" in _one_line(err) and "use model 'tiny_edit'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        models.get("tiny_edit")(data="glyphs", weights=None)
    assert "unknown data 'glyphs'" in _one_line(err)


def test_the_shipped_text_to_image_files_load_unchanged(tmp_path):
    from safetensors import safe_open

    for data, shape in (("shapes", (3, 32, 32)), ("glyphs", (3, 16, 48))):
        path = tiny.shipped_weights(data)
        with safe_open(str(path), framework="pt") as handle:
            assert "source_channels" not in json.loads(handle.metadata()["arch"])
        loaded = models.get("tiny")(data=data)
        assert loaded.arch.source_channels == 0 and loaded.latent_shape == shape
        assert loaded.transformer.config.in_channels == 3 and loaded.tokenizer.vocab_size == 60
    # a text-to-image file written now has the same arch record as before the field existed
    save_weights(tmp_path / "w.safetensors", loaded.arch, loaded.transformer, loaded.text_encoder)
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as handle:
        assert "source_channels" not in json.loads(handle.metadata()["arch"])


# ---- training ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["flow_grpo", "op_grpo"])
def test_one_training_step_on_edit_prompts(model, edits, algorithm):
    from tests.adapter_training import check_training

    prompts, metadata = edits
    check_training(model, algorithm, prompts, metadata)


def test_op_grpo_replays_an_edit_with_its_own_source(model, edits, monkeypatch):
    from tests.adapter_training import check_op_grpo_replays_edits

    _, metadata = edits
    check_op_grpo_replays_edits(model, metadata, monkeypatch, instruction="make the circle red")


def test_the_config_resolves_and_runs_two_steps_on_a_random_model(tmp_path):
    import pandas as pd

    from flowzoo.benchmark.cli import main
    from flowzoo.benchmark.run.loading import load_config

    config = load_config(CONFIG, [])
    assert (config.model.name, config.reward, config.prompts.source) == ("tiny_edit", "shapes_edit", "tiny_edit")
    assert main(["train", CONFIG, "--quiet", f"run_dir={tmp_path}", *SMALL_RUN]) == 0
    metrics = pd.read_csv(tmp_path / "metrics.csv")
    assert list(metrics["step"]) == [0, 1, 2] and (tmp_path / "done.json").exists()
    assert metrics[["eval/edit", "eval/preserve", "reward/edit"]].iloc[1:].notna().all().all()


# ---- the prompt source -------------------------------------------------------------------------------------------
def test_the_tiny_edit_prompt_source():
    from flowzoo.benchmark.prompts.sources import PromptSection, load_prompts

    train, test = load_prompts(PromptSection(source="tiny_edit"))
    assert (len(train), len(test)) == (1024, 256)
    for prompts in (train, test):
        assert all(m[SOURCE_IMAGE].shape == (3, 32, 32) and 0 <= m[SOURCE_IMAGE].min() <= m[SOURCE_IMAGE].max() <= 1
                   for _, m in prompts)
        assert {m["tag"] for _, m in prompts} == set(EDIT_KINDS)
    again, _ = load_prompts(PromptSection(source="tiny_edit"))
    assert [p for p, _ in again] == [p for p, _ in train]
    assert all(torch.equal(a[SOURCE_IMAGE], b[SOURCE_IMAGE]) for (_, a), (_, b) in zip(again, train))
    assert not torch.equal(train[0][1][SOURCE_IMAGE], test[0][1][SOURCE_IMAGE])  # held out: another seed
    _, validation = load_prompts(PromptSection(source="tiny_edit", eval_split="validation"))
    assert len(validation) == 256 and not torch.equal(validation[0][1][SOURCE_IMAGE], test[0][1][SOURCE_IMAGE])
    removes, _ = load_prompts(PromptSection(source="tiny_edit", tags=["remove"]))
    assert removes and all(p.startswith("remove the ") for p, _ in removes)
    with pytest.raises(ConfigError) as err:
        load_prompts(PromptSection(source="tiny_edit", tags=["counting"]))
    assert "unknown tag 'counting'; valid: recolor, add, remove" in _one_line(err)


def test_flowzoo_list_shows_the_edit_model():
    from flowzoo.benchmark.catalog import detail, overview

    assert any(line.split()[:1] == ["tiny_edit"] for line in overview().splitlines())
    assert "model tiny_edit: The tiny edit tier" in detail("tiny_edit")


# ---- pretraining -------------------------------------------------------------------------------------------------
def test_init_starts_the_edit_model_as_the_text_to_image_model(tmp_path, edits):
    from flowzoo.models.tiny_pretrain import pretrain

    t2i_file = _text_to_image_file(tmp_path / "t2i.safetensors")
    common = dict(init=t2i_file, batch=2, threads=None, progress=False, warmup=1)
    start = pretrain("shapes_edit", out=tmp_path / "e0.safetensors", run_dir=tmp_path / "r0", minutes=0, **common)
    arch, tensors, _ = read_weights(start)
    _, t2i_tensors, _ = read_weights(t2i_file)
    assert arch.source_channels == 3 and tensors[PATCH_WEIGHT][:, 3:].abs().max() == 0
    assert torch.equal(tensors[PATCH_WEIGHT][:, :3], t2i_tensors[PATCH_WEIGHT])
    assert torch.equal(tensors[TOKEN_EMBEDDING][:60], t2i_tensors[TOKEN_EMBEDDING])
    edit = models.get("tiny_edit")(weights=str(start), lora_rank=2)
    t2i = models.get("tiny")(weights=str(t2i_file), lora_rank=2)
    prompts, metadata = edits
    words = ["a red circle", "two blue squares"]  # words of both vocabularies
    x, sigma = torch.randn(2, 3, 32, 32), torch.tensor([0.9, 0.3])
    with torch.no_grad():
        expected = t2i.predict(x, sigma, t2i.encode(words))
        for sources in (metadata, metadata[::-1]):  # whatever the source
            assert torch.allclose(edit.predict(x, sigma, edit.encode(words, sources)), expected, atol=1e-6)
    trained = pretrain("shapes_edit", out=tmp_path / "e1.safetensors", run_dir=tmp_path / "r1", steps=1, **common)
    assert read_weights(trained)[1][PATCH_WEIGHT][:, 3:].abs().max() > 0  # the source weights learn from step one


def test_edit_pretraining_resumes_exactly(tmp_path):
    from flowzoo.models.tiny_pretrain import pretrain

    t2i_file = _text_to_image_file(tmp_path / "t2i.safetensors")
    common = dict(init=t2i_file, batch=2, threads=None, progress=False, warmup=2)
    straight = pretrain("shapes_edit", out=tmp_path / "a.safetensors", run_dir=tmp_path / "a", steps=3, **common)
    pretrain("shapes_edit", out=tmp_path / "b.safetensors", run_dir=tmp_path / "b", steps=1, **common)
    resumed = pretrain("shapes_edit", out=tmp_path / "b.safetensors", run_dir=tmp_path / "b", steps=3, **common)
    _, a, info_a = read_weights(straight)
    _, b, info_b = read_weights(resumed)
    assert info_a["pretrain"]["steps_done"] == info_b["pretrain"]["steps_done"] == 3
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    other = _text_to_image_file(tmp_path / "other.safetensors", seed=4)
    with pytest.raises(ConfigError) as err:  # the checkpoint records its --init file
        pretrain("shapes_edit", out=tmp_path / "b.safetensors", run_dir=tmp_path / "b", steps=4,
                 **{**common, "init": other})
    assert "written with other settings" in _one_line(err)
    # from scratch (no --init) trains too, on a random edit model of the given sizes
    scratch = pretrain("shapes_edit", out=tmp_path / "s.safetensors", run_dir=tmp_path / "s", steps=1, arch=SMALL,
                       batch=2, threads=None, progress=False)
    assert read_weights(scratch)[0].source_channels == 3


def test_bad_init_files_are_one_line_config_errors(tmp_path, model):
    from safetensors.torch import save_file

    from flowzoo.models.tiny_pretrain import pretrain

    common = dict(run_dir=tmp_path / "r", steps=1, batch=2, threads=None, progress=False)
    edit_file = tmp_path / "edit.safetensors"
    save_weights(edit_file, model.arch, model.transformer, model.text_encoder)
    glyphs = models.get("tiny")(data="glyphs", weights=None, arch=SMALL, lora_rank=2)
    glyph_file = tmp_path / "glyphs.safetensors"
    save_weights(glyph_file, glyphs.arch, glyphs.transformer, glyphs.text_encoder)
    save_file({"w": torch.zeros(1)}, str(tmp_path / "plain.safetensors"))
    cases = [(dict(data="shapes_edit", init=edit_file), "holds an edit model"),
             (dict(data="shapes_edit", init=glyph_file), "holds a text-to-image model of 'glyphs'"),
             (dict(data="shapes_edit", init=tmp_path / "plain.safetensors"), "has no 'arch' metadata"),
             (dict(data="shapes_edit", init=tmp_path / "none.safetensors"), "does not exist"),
             (dict(data="shapes", init=_text_to_image_file(tmp_path / "t2i.safetensors")), "it needs --data shapes_edit"),
             (dict(data="shapes_edit", init=tmp_path / "t2i.safetensors", arch={"layers": 3}), "conflicts with"),
             (dict(data="faces"), "unknown --data 'faces'; known: shapes, glyphs, shapes_edit")]
    for kwargs, expected in cases:
        with pytest.raises(ConfigError) as err:
            pretrain(kwargs.pop("data"), **common, **kwargs)
        assert expected in _one_line(err), kwargs
    assert not (tmp_path / "r").exists()  # refused before anything was written


def test_the_pretrain_command_takes_init(tmp_path):
    from flowzoo.benchmark.cli import main
    from flowzoo.benchmark.run.pretrain_command import DATA_CHOICES
    from flowzoo.models.tiny_pretrain import PRETRAIN_DATA

    assert DATA_CHOICES == PRETRAIN_DATA
    t2i_file = _text_to_image_file(tmp_path / "t2i.safetensors")
    out, run_dir = tmp_path / "w.safetensors", tmp_path / "run"
    assert main(["pretrain", "tiny", "--data", "shapes_edit", "--init", str(t2i_file), "--steps", "1", "--batch", "2",
                 "--threads", "1", "--out", str(out), "--run-dir", str(run_dir), "--quiet"]) == 0
    record = json.loads((run_dir / "pretrain.json").read_text())
    assert f"--data shapes_edit --init {t2i_file}" in record["command"] and record["settings"]["init"]
    assert models.get("tiny_edit")(weights=str(out)).arch.source_channels == 3


def test_flowzoo_list_shows_the_edit_tier_and_every_prompt_source(capsys):
    from flowzoo.benchmark.cli import main
    from flowzoo.benchmark.prompts.sources import SOURCE_SUMMARIES, SOURCES

    assert set(SOURCE_SUMMARIES) == set(SOURCES)  # a new source without its line would be a KeyError in the list
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    sources = out.split("prompt sources:")[1].split("suites:")[0]
    assert all(f"  {name} " in sources for name in SOURCES)
    assert "  tiny_edit " in out.split("models:")[1].split("rewards:")[0]
    assert all(f"  {name} " in out for name in ("flux_kontext", "qwen_image_edit", "wan22", "shapes_edit"))
