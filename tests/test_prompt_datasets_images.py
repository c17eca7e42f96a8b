"""The ``dataset`` prompt source's image column as each prompt's source image (benchmark/prompts/dataset_images.py):
images and arrays become [3, H, W] tensors in [0, 1], paths absolute paths; the column is ``image`` by default,
configurable, and bad cells are one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flowzoo.benchmark.prompts.sources import PromptSection, load_prompts
from flowzoo.errors import ConfigError
from flowzoo.source_images import SOURCE_IMAGE, read_source_image

datasets = pytest.importorskip("datasets")
Image = pytest.importorskip("PIL.Image")

#: two 4 x 5 (W x H) RGB sources, every pixel its own value
PIXELS = [np.arange(60, dtype=np.uint8).reshape(5, 4, 3) * 4, 255 - np.arange(60, dtype=np.uint8).reshape(5, 4, 3)]
EXPECTED = [torch.from_numpy(p.astype(np.float32) / 255).permute(2, 0, 1) for p in PIXELS]
PROMPTS = ["make the circle red", "remove the square"]


def _section(path, **dataset):
    return PromptSection(source="dataset", train=str(path), test=str(path), dataset=dataset or None)


def test_a_saved_image_column_becomes_each_prompts_source_tensor(tmp_path):
    data = datasets.Dataset.from_dict({"prompt": PROMPTS, "image": [Image.fromarray(p) for p in PIXELS]},
                                      features=datasets.Features({"prompt": datasets.Value("string"),
                                                                  "image": datasets.Image()}))
    data.save_to_disk(str(tmp_path / "edits"))
    train, test = load_prompts(_section(tmp_path / "edits"))
    assert [p for p, _ in train] == PROMPTS and len(test) == 2
    for (_, metadata), expected in zip(train, EXPECTED):
        source = metadata[SOURCE_IMAGE]
        assert source.shape == (3, 5, 4) and source.dtype == torch.float32
        torch.testing.assert_close(source, expected, rtol=0, atol=0)  # PNG round trip: lossless
        assert read_source_image(metadata, "test").shape == (1, 3, 5, 4)  # what the edit models read
    assert not torch.equal(train[0][1][SOURCE_IMAGE], train[1][1][SOURCE_IMAGE])
    # image: "" reads none; a text-only dataset has none
    assert all(SOURCE_IMAGE not in m for _, m in load_prompts(_section(tmp_path / "edits", image=""))[0])


def test_array_and_path_columns_and_a_named_column(tmp_path):
    hwc = [p.tolist() for p in PIXELS]  # integers 0-255, channels last
    chw = [(p.astype(np.float32) / 255).transpose(2, 0, 1).tolist() for p in PIXELS]  # floats in [0, 1], channels first
    Image.fromarray(PIXELS[1]).save(tmp_path / "1.png")
    data = datasets.Dataset.from_dict({"prompt": PROMPTS, "hwc": hwc, "chw": chw,
                                       "src": ["0.png", str(tmp_path / "1.png")]})
    data.save_to_disk(str(tmp_path / "edits"))
    Image.fromarray(PIXELS[0]).save(tmp_path / "edits" / "0.png")  # beside the dataset's files
    for column in ("hwc", "chw"):
        train, _ = load_prompts(_section(tmp_path / "edits", image=column))
        for (_, metadata), expected in zip(train, EXPECTED):
            torch.testing.assert_close(metadata[SOURCE_IMAGE], expected, rtol=0, atol=1e-6)
    train, _ = load_prompts(_section(tmp_path / "edits", image="src"))
    # the relative path resolved against the dataset's folder, the absolute one kept
    assert [m[SOURCE_IMAGE] for _, m in train] == [str((tmp_path / "edits" / "0.png").resolve()),
                                                  str((tmp_path / "1.png").resolve())]


def test_bad_image_cells_and_columns_are_one_line(tmp_path):
    cases = {
        "missing_file": ({"image": ["nope.png", "nope.png"]}, {}, "row 0 of column 'image': source image"),
        "four_channels": ({"image": [np.zeros((2, 2, 4), np.uint8).tolist()] * 2}, {}, "1 or 3 channels"),
        "out_of_range": ({"image": [np.full((3, 2, 2), 2.0).tolist()] * 2}, {}, "must lie in [0, 1]"),
        "flat": ({"image": [[0.5, 0.5]] * 2}, {}, "shape [C, H, W] or [H, W, C]"),
        "unknown_column": ({"image": ["a.png"] * 2}, {"image": "picture"}, "has no image column 'picture'"),
    }
    for name, (columns, spec, expected) in cases.items():
        datasets.Dataset.from_dict({"prompt": PROMPTS, **columns}).save_to_disk(str(tmp_path / name))
        with pytest.raises(ConfigError) as err:
            load_prompts(_section(tmp_path / name, **spec))
        assert expected in str(err.value) and "\n" not in str(err.value), (name, str(err.value))
    with pytest.raises(ConfigError, match="prompts.dataset.image: bad value 3"):
        load_prompts(_section(tmp_path / "flat", image=3))
