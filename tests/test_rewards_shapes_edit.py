"""``shapes_edit`` on rendered scenes, the edit grammar, and the (source, instruction, target) triples."""

import pytest
import torch
from PIL import Image

from flowzoo import rewards
from flowzoo.errors import ConfigError
from flowzoo.models.tiny_data import ShapeObject, render_shapes
from flowzoo.models.tiny_edit_data import (EDIT_FORMS, EditInstruction, edit_batch, parse_instruction,
                                           sample_edit_triple)

CIRCLE = ShapeObject("circle", "red", (2, 10, 13, 21))
SQUARE = ShapeObject("square", "blue", (19, 10, 30, 21))
TRIANGLE = ShapeObject("triangle", "green", (11, 0, 20, 9))


def recoloured(obj, color):
    return ShapeObject(obj.shape, color, obj.box)


def terms(source_objects, output_objects, instruction, **args):
    """(score, edit, preserve) of one output scene against its source scene."""
    reward = rewards.build("shapes_edit", {"shapes_edit": args} if args else None)
    out = reward(render_shapes(output_objects)[None], [instruction],
                 [{"source_image": render_shapes(source_objects)}])
    return float(out.score[0]), float(out.components["edit"][0]), float(out.components["preserve"][0])


# (source, instruction, correct output, the correct output with another object changed)
CASES = {
    "recolor": ([CIRCLE, SQUARE], "make the circle green", [recoloured(CIRCLE, "green"), SQUARE],
                [recoloured(CIRCLE, "green"), recoloured(SQUARE, "yellow")]),
    "add": ([CIRCLE], "add a blue square", [CIRCLE, SQUARE], [recoloured(CIRCLE, "yellow"), SQUARE]),
    "remove": ([CIRCLE, SQUARE], "remove the square", [CIRCLE], [ShapeObject("circle", "red", (2, 2, 13, 13))]),
}


@pytest.mark.parametrize("kind", CASES)
def test_correct_edit_scores_high_on_both_terms(kind):
    source, instruction, edited, _ = CASES[kind]
    assert terms(source, edited, instruction) == (1.0, 1.0, 1.0)


@pytest.mark.parametrize("kind", CASES)
def test_no_edit_scores_low_on_edit_and_high_on_preserve(kind):
    source, instruction, _, _ = CASES[kind]
    assert terms(source, source, instruction) == (0.5, 0.0, 1.0)


@pytest.mark.parametrize("kind", CASES)
def test_correct_edit_that_also_changes_another_object_loses_preserve(kind):
    source, instruction, _, overedited = CASES[kind]
    score, edit, preserve = terms(source, overedited, instruction)
    assert edit == 1.0 and preserve == 0.0 and score == 0.5  # the one object to keep changed


def test_wrong_edits_fail_the_edit_term():
    # the circle recoloured to the wrong colour; an added object of the wrong shape; the square replaced by a circle
    assert terms([CIRCLE, SQUARE], [recoloured(CIRCLE, "blue"), SQUARE], "make the circle green")[1] == 0.0
    assert terms([CIRCLE], [CIRCLE, ShapeObject("triangle", "blue", SQUARE.box)], "add a blue square")[1:] == (0, 0.5)
    replaced = [CIRCLE, ShapeObject("circle", "blue", SQUARE.box)]
    assert terms([CIRCLE, SQUARE], replaced, "remove the square")[1:] == (1.0, 0.5)  # gone, but a new object came


def test_preserve_counts_each_change_once_and_new_objects_beside():
    source = [CIRCLE, SQUARE, TRIANGLE]
    one_changed = [recoloured(CIRCLE, "green"), recoloured(SQUARE, "red"), TRIANGLE]
    assert terms(source, one_changed, "make the circle green")[1:] == (1.0, 0.5)  # 1 of 2 kept
    extra = [recoloured(CIRCLE, "green"), SQUARE, TRIANGLE, ShapeObject("circle", "yellow", (12, 22, 21, 31))]
    assert terms(source, extra, "make the circle green")[1:] == (1.0, pytest.approx(2 / 3))  # 2 kept, 1 new


def test_a_blank_output_keeps_nothing():
    assert terms([CIRCLE, SQUARE], [], "make the circle green")[1:] == (0.0, 0.0)
    assert terms([CIRCLE], [], "remove the circle")[1:] == (1.0, 1.0)  # the correct edit of a one-object scene


def test_weights_and_tolerance_are_arguments():
    source, instruction, _, _ = CASES["recolor"]
    assert terms(source, source, instruction, edit_weight=3, preserve_weight=1)[0] == pytest.approx(0.25)
    moved = [recoloured(CIRCLE, "green"), ShapeObject("square", "blue", (19, 14, 30, 25))]  # 4 px down: 0.125
    assert terms(source, moved, instruction)[2] == 0.0  # the moved square, the one object to keep, changed
    assert terms(source, moved, instruction, position_tolerance=0.2)[2] == 1.0
    with pytest.raises(ConfigError, match="edit_weight and preserve_weight must be finite numbers >= 0"):
        rewards.build("shapes_edit", {"shapes_edit": {"edit_weight": -1}})
    with pytest.raises(ConfigError, match="position_tolerance must be in"):
        rewards.build("shapes_edit", {"shapes_edit": {"position_tolerance": 0}})


def test_source_from_an_image_file(tmp_path):
    path = tmp_path / "source.png"
    Image.fromarray((render_shapes([CIRCLE, SQUARE]) * 255).round().byte().permute(1, 2, 0).numpy()).save(path)
    out = rewards.get("shapes_edit")()(render_shapes([CIRCLE])[None], ["remove the square"],
                                       [{"source_image": str(path)}])
    assert out.score.tolist() == [1.0]


def one_line_error(instruction, metadata, output=(CIRCLE,)):
    with pytest.raises(ConfigError) as error:
        rewards.get("shapes_edit")()(render_shapes(list(output))[None], [instruction], [metadata])
    assert "\n" not in str(error.value)
    return str(error.value)


def test_bad_instruction_missing_source_and_unnamed_object_are_one_line_errors():
    source = {"source_image": render_shapes([CIRCLE, SQUARE])}
    message = one_line_error("paint the circle red", source)
    assert "'paint the circle red'" in message and all(form in message for form in EDIT_FORMS.values())
    assert "'make the hexagon red'" in one_line_error("make the hexagon red", source)
    message = one_line_error("make the circle red", {})
    assert "shapes_edit" in message and "no source image in metadata['source_image']" in message
    message = one_line_error("remove the triangle", source)
    assert "names 0 objects of its source image (the detector finds red circle, blue square)" in message
    assert "must be an image path" in one_line_error("remove the circle", {"source_image": 3})


def test_grammar_round_trips_and_ignores_case_and_spacing():
    for edit in (EditInstruction("recolor", "circle", "red"), EditInstruction("add", "triangle", "blue"),
                 EditInstruction("remove", "square")):
        assert parse_instruction(edit.text()) == edit
    assert parse_instruction("  Make the  CIRCLE red ") == EditInstruction("recolor", "circle", "red")
    with pytest.raises(ConfigError, match="'add a red circle please' is not one of the forms"):
        parse_instruction("add a red circle please")


def test_triples_are_deterministic_and_their_targets_score_one():
    assert sample_edit_triple(3, 7) == sample_edit_triple(3, 7) != sample_edit_triple(4, 7)
    sources, targets, prompts, metadata = edit_batch(5, 0, 60)
    again = edit_batch(5, 20, 10)  # a triple is a function of (seed, index), not of the batch
    assert torch.equal(again[0], sources[20:30]) and again[2] == prompts[20:30]
    assert {parse_instruction(p).kind for p in prompts} == {"recolor", "add", "remove"}
    reward = rewards.get("shapes_edit")()
    assert reward(targets, prompts, metadata).score.tolist() == [1.0] * 60
    unedited = reward(sources, prompts, metadata)
    assert unedited.components["edit"].tolist() == [0.0] * 60 and unedited.components["preserve"].tolist() == [1.0] * 60
