"""``shapes_geneval`` on rendered ground-truth scenes, and the OCR reward's upscale option on rendered glyphs."""

import pytest
import torch

from flowzoo import rewards
from flowzoo.errors import ConfigError
from flowzoo.models.tiny_data import ShapeObject, render_glyphs, render_shapes, shapes_prompt_and_metadata
from flowzoo.rewards.shapes import ShapesGenEval

RED_CIRCLE = ShapeObject("circle", "red", (2, 10, 13, 21))
BLUE_SQUARE = ShapeObject("square", "blue", (19, 10, 30, 21))
RED_CIRCLE_2 = ShapeObject("circle", "red", (19, 10, 30, 21))


def score(objects_drawn, tag, objects_prompted, relation=None, image=None):
    prompt, meta = shapes_prompt_and_metadata(tag, objects_prompted, relation)
    image = render_shapes(objects_drawn) if image is None else image
    out = rewards.get("shapes_geneval")()(image[None], [prompt], [meta])
    return float(out.score[0]), float(out.components["strict_accuracy"][0])


@pytest.mark.parametrize("tag,objects,relation", [
    ("colors", [RED_CIRCLE], None),
    ("counting", [RED_CIRCLE, RED_CIRCLE_2], None),
    ("two_object", [BLUE_SQUARE, RED_CIRCLE], None),
    ("position", [BLUE_SQUARE, RED_CIRCLE], "left of"),  # "a red circle left of a blue square"
])
def test_exact_scene_scores_one_and_passes_strictly(tag, objects, relation):
    assert score(objects, tag, objects, relation) == (1.0, 1.0)


def test_each_shape_is_recognised():
    for shape in ("circle", "square", "triangle"):
        obj = ShapeObject(shape, "green", (8, 8, 21, 21))
        assert score([obj], "colors", [obj]) == (1.0, 1.0), shape


def test_wrong_colour_keeps_the_count_check():
    blue_circle = ShapeObject("circle", "blue", RED_CIRCLE.box)
    assert score([blue_circle], "colors", [RED_CIRCLE]) == (0.5, 0.0)  # count 1/1, colour 0/1


def test_wrong_count_fails_count_and_colour():
    # "two red circles" with one drawn: count and colour fail, "fewer than 3" passes -> 1/3
    assert score([RED_CIRCLE], "counting", [RED_CIRCLE, RED_CIRCLE_2]) == (pytest.approx(1 / 3), 0.0)
    # three drawn: count and colour pass, the exclude check fails -> 2/3
    third = ShapeObject("circle", "red", (11, 24, 18, 31))
    small = [ShapeObject("circle", "red", (1, 1, 9, 9)), ShapeObject("circle", "red", (22, 1, 30, 9)), third]
    assert score(small, "counting", small[:2]) == (pytest.approx(2 / 3), 0.0)


def test_wrong_position_loses_only_the_position_check():
    # prompt: "a red circle right of a blue square", drawn left of it -> 4 of 5 checks
    assert score([BLUE_SQUARE, RED_CIRCLE], "position", [BLUE_SQUARE, RED_CIRCLE], "right of") == (pytest.approx(0.8), 0.0)


@pytest.mark.parametrize("name,image", [
    ("empty", torch.zeros(3, 32, 32)),
    ("full-frame red", torch.tensor([0.9, 0.12, 0.12]).view(3, 1, 1).expand(3, 32, 32).clone()),
    ("noise", torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(0))),
    ("speckled red", (torch.rand(1, 32, 32, generator=torch.Generator().manual_seed(1)) > 0.5) * torch.tensor([0.9, 0.12, 0.12]).view(3, 1, 1)),
])
@pytest.mark.parametrize("tag", ["colors", "counting"])
def test_degenerate_images_score_zero(name, image, tag):
    prompted = [RED_CIRCLE] if tag == "colors" else [RED_CIRCLE, RED_CIRCLE_2]
    assert score([], tag, prompted, image=image) == (0.0, 0.0), name


def test_half_frame_field_is_not_an_object():
    field = ShapeObject("square", "red", (0, 0, 31, 20))
    assert score([field], "colors", [ShapeObject("square", "red", (0, 0, 12, 12))]) == (0.0, 0.0)


def test_strict_score_is_all_checks_passed_and_logs_the_partial_credit():
    # "two red circles" with one drawn (partial 1/3) and with both drawn (1)
    prompt, meta = shapes_prompt_and_metadata("counting", [RED_CIRCLE, RED_CIRCLE_2])
    images = torch.stack([render_shapes([RED_CIRCLE]), render_shapes([RED_CIRCLE, RED_CIRCLE_2])])
    strict = rewards.get("shapes_geneval")(score="strict")(images, [prompt] * 2, [meta] * 2)
    assert strict.score.tolist() == [0.0, 1.0]
    assert strict.components["partial_score"].tolist() == pytest.approx([1 / 3, 1.0])
    assert strict.components["strict_accuracy"].tolist() == [0.0, 1.0]
    partial = rewards.get("shapes_geneval")()(images, [prompt] * 2, [meta] * 2)
    assert partial.score.tolist() == pytest.approx([1 / 3, 1.0]) and "partial_score" not in partial.components


@pytest.mark.parametrize("name", ["shapes_geneval", "geneval"])
def test_unknown_score_kind_is_named(name):
    with pytest.raises(ConfigError, match=f"{name} reward: unknown score 'exact'; valid: partial, strict"):
        rewards.get(name)(score="exact", detector=lambda images: []) if name == "geneval" else rewards.get(name)(score="exact")


def test_metadata_without_include_is_an_error():
    with pytest.raises(ConfigError, match="include"):
        ShapesGenEval()(torch.zeros(1, 3, 32, 32), ["a red circle"], [{}])


def test_ocr_reads_rendered_glyphs_after_upscaling():
    images = torch.stack([render_glyphs("AB3"), render_glyphs("K7")])
    prompts = ['the text "AB3"', 'the text "K7"']
    assert rewards.get("ocr")(upscale=2, pad=4)(images, prompts).score.tolist() == [1.0, 1.0]
    blank = rewards.get("ocr")(upscale=2, pad=4)(torch.zeros(1, 3, 16, 48), prompts[:1]).score
    assert blank.tolist() == [0.0]
    with pytest.raises(ConfigError):
        rewards.get("ocr")(upscale=0)
