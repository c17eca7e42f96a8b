"""Prompt datasets in Flow-GRPO's file formats, on small fixtures written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowzoo.errors import ConfigError
from flowzoo.benchmark.prompts.files import read_prompts, resolve_prompt_file

GENEVAL = [
    {"tag": "counting", "include": [{"class": "wine glass", "count": 2}],
     "exclude": [{"class": "wine glass", "count": 3}], "prompt": "a photo of two wine glasses"},
    {"tag": "color_attr", "include": [{"class": "handbag", "count": 1, "color": "pink"},
                                      {"class": "scissors", "count": 1, "color": "black"}],
     "prompt": "a photo of a pink handbag and a black scissors"},
    {"tag": "position", "include": [{"class": "dog", "count": 1},
                                    {"class": "cat", "count": 1, "position": ["left of", 0]}],
     "prompt": "a photo of a cat left of a dog"},
]


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "train.txt").write_text("a red cube\n  a blue sphere  \n\nthe sign says \"hello\"\n")
    (tmp_path / "test.txt").write_text("one test prompt\n")
    return tmp_path


@pytest.fixture
def geneval(tmp_path):
    lines = "\n".join(json.dumps(r) for r in GENEVAL) + "\n"
    (tmp_path / "test_metadata.jsonl").write_text(lines)
    return tmp_path


def test_txt_one_prompt_a_line(folder):
    rows = read_prompts(folder, "train")
    assert rows == [("a red cube", {}), ("a blue sphere", {}), ('the sign says "hello"', {})]
    assert read_prompts(folder, "test") == [("one test prompt", {})]
    assert read_prompts(folder / "train.txt")[0] == ("a red cube", {})


def test_geneval_metadata_is_kept_exactly(geneval):
    rows = read_prompts(geneval, "test")
    assert [p for p, _ in rows] == [r["prompt"] for r in GENEVAL]
    assert [m for _, m in rows] == GENEVAL
    assert "exclude" not in rows[1][1] and "color" not in rows[2][1]["include"][0]


def test_jsonl_wins_over_txt(geneval):
    (geneval / "test.txt").write_text("ignored\n")
    assert resolve_prompt_file(geneval, "test").name == "test_metadata.jsonl"


def test_errors_name_the_path(tmp_path):
    with pytest.raises(ConfigError, match="nowhere"):
        read_prompts(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="train.txt"):
        read_prompts(tmp_path, "train")
    bad = tmp_path / "bad_metadata.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"tag": "x"}\n')
    with pytest.raises(ConfigError, match="bad_metadata.jsonl:2"):
        read_prompts(bad)
    bad.write_text("not json\n")
    with pytest.raises(ConfigError, match=":1"):
        read_prompts(bad)
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ConfigError, match="no prompts"):
        read_prompts(tmp_path / "empty.txt")


REAL = Path("/work/shared/data/flow_grpo_prompts")


@pytest.mark.skipif(not REAL.is_dir(), reason="reference prompt files not present")
def test_real_flow_grpo_files():
    geneval = read_prompts(REAL / "geneval", "test")
    assert len(geneval) == 2212 and {m["tag"] for _, m in geneval} >= {"counting", "color_attr", "position"}
    assert len(read_prompts(REAL / "ocr", "test")) == 1018
    assert len(read_prompts(REAL / "pickscore", "test")) == 2048


def edit_pairs(tmp_path, records) -> Path:
    from PIL import Image

    (tmp_path / "sources").mkdir(exist_ok=True)
    Image.new("RGB", (8, 8), (200, 10, 10)).save(tmp_path / "sources" / "red.png")
    (tmp_path / "train_metadata.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return tmp_path


def test_edit_pairs_carry_their_source_image_as_an_absolute_path(tmp_path):
    """(image, instruction) pairs: ``image`` relative to the file's folder becomes metadata["source_image"], the
    resolved absolute path, beside the record's own fields."""
    folder = edit_pairs(tmp_path, [{"prompt": "make it blue", "image": "sources/red.png", "tag": "color"},
                                   {"prompt": "no source", "tag": "t2i"}])
    (prompt, meta), (plain, plain_meta) = read_prompts(folder, "train")
    assert prompt == "make it blue" and meta["tag"] == "color" and meta["image"] == "sources/red.png"
    assert meta["source_image"] == str((tmp_path / "sources" / "red.png").resolve())
    assert plain == "no source" and "source_image" not in plain_meta


@pytest.mark.parametrize("image, message", [
    ("sources/missing.png", r"train_metadata.jsonl:2: source image '.*missing.png' does not exist"),
    ("sources/notes.txt", r"train_metadata.jsonl:2: source image '.*notes.txt' is not a readable image"),
    (3, r"train_metadata.jsonl:2: 'image' must be the path of the source image \(a non-empty string\), got 3"),
])
def test_a_bad_source_image_is_one_line_naming_file_and_line(tmp_path, image, message):
    folder = edit_pairs(tmp_path, [{"prompt": "fine", "image": "sources/red.png"}, {"prompt": "bad", "image": image}])
    (tmp_path / "sources" / "notes.txt").write_text("not an image")
    with pytest.raises(ConfigError, match=message) as err:
        read_prompts(folder, "train")
    assert "\n" not in str(err.value)
