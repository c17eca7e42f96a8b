"""``shapes_edit``: a programmatic instruction-edit reward on the tiny tier's shape scenes.

A sample is the edited image; its prompt is an instruction of the grammar in ``models/tiny_edit_data.py``
(``make the <shape> <colour>``, ``add a <colour> <shape>``, ``remove the <shape>``; anything else is a one-line
ConfigError naming it and the forms) and its metadata carries the source image (``metadata["source_image"]``).

The expected edit is derived from the source, not stored: both images go through the colour-segmentation detector
of ``shapes_geneval`` (``rewards/shapes.py``), and the instruction says which source object changes. So any source
image works (a path, a tensor), the edit tier needs to store nothing beside the source, and a detector miss on the
source is an error, not a silent wrong target. Objects are compared by shape, colour and centre, the centre in
fractions of the frame (source and output may differ in size), within ``position_tolerance`` (0.1 of the frame:
3.2 px on 32x32, a third of the smallest object; ours).

* The named object (recolour, remove): the source's one object of the instruction's shape (none or two is an
  error). The *kept* objects are every other source object (all of them for add).
* Each kept object is matched to an output object of the same shape and colour within the tolerance (nearest pairs
  first, one to one). What is left of the output is either the named object, edited or not (its shape, within the
  tolerance of its source centre), or a change nobody asked for.
* ``edit`` (0 or 1): recolour: the named object is there in the new colour; remove: the named object is gone (no
  object of its shape near its place); add: a left-over object of the asked shape and colour (anywhere).
* ``preserve`` = kept objects found / (kept objects + new objects): a kept object moved, recoloured, reshaped or
  gone is not found (it counts once: what it became is not counted again), and output objects nobody asked for
  beyond those (new objects, beyond the one an add asks for) add to the denominator; 1 when the source has nothing
  to keep and nothing new appeared.

Score: the weighted mean of ``edit`` and ``preserve`` (``rewards/edit_score.py``; weights 0.5 / 0.5), both logged
as components. Doing nothing scores edit 0, preserve 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from flowzoo.errors import ConfigError
from flowzoo.ranges import FRACTION, NON_NEGATIVE, POSITIVE, Range
from flowzoo.models.tiny_edit_data import EditInstruction, parse_instruction
from flowzoo.rewards import register
from flowzoo.rewards.base import Reward, RewardOutput
from flowzoo.rewards.edit_score import EDIT_WEIGHT, PRESERVE_WEIGHT, check_weights, edit_output, source_image
from flowzoo.rewards.shapes import ColourSegmentationDetector

POSITION_TOLERANCE = 0.1  # centre distance, in frame sides


@dataclass(frozen=True)
class Placed:
    """A detected object: shape, colour and centre (x, y) in fractions of the frame's width and height."""

    shape: str
    color: str
    center: tuple[float, float]


def placed_objects(detector: ColourSegmentationDetector, image: torch.Tensor) -> list[Placed]:
    height, width = image.shape[-2:]
    return [Placed(d.label, d.color, ((d.box[0] + d.box[2]) / 2 / width, (d.box[1] + d.box[3]) / 2 / height))
            for d in detector.detect(image)]


def distance(a: Placed, b: Placed) -> float:
    return math.dist(a.center, b.center)


def match_kept(kept: Sequence[Placed], found: Sequence[Placed], tolerance: float) -> tuple[int, list[Placed]]:
    """How many ``kept`` objects have a partner in ``found`` (same shape and colour, centre within ``tolerance``;
    nearest pairs first, one to one), and the ``found`` objects left without one."""
    pairs = sorted((distance(k, f), i, j) for i, k in enumerate(kept) for j, f in enumerate(found)
                   if (k.shape, k.color) == (f.shape, f.color) and distance(k, f) <= tolerance)
    used_kept, used_found = set(), set()
    for _, i, j in pairs:
        if i not in used_kept and j not in used_found:
            used_kept.add(i)
            used_found.add(j)
    return len(used_kept), [f for j, f in enumerate(found) if j not in used_found]


def named_object(source: Sequence[Placed], edit: EditInstruction) -> Placed | None:
    """The source object a recolour or remove acts on (None for add); a ValueError unless there is exactly one."""
    if edit.kind == "add":
        return None
    named = [obj for obj in source if obj.shape == edit.shape]
    if len(named) != 1:
        held = ", ".join(f"{obj.color} {obj.shape}" for obj in source) or "no object"
        raise ValueError(f"it names {len(named)} objects of its source image (the detector finds {held}), not one")
    return named[0]


def edit_terms(source: Sequence[Placed], output: Sequence[Placed], edit: EditInstruction,
               tolerance: float) -> tuple[float, float]:
    """(edit, preserve) of one output against its source (module docstring)."""
    named = named_object(source, edit)
    kept = [obj for obj in source if obj is not named]
    found, left = match_kept(kept, output, tolerance)
    at_named = [f for f in left if named is not None and f.shape == named.shape and distance(f, named) <= tolerance]
    unasked = [f for f in left if not any(f is g for g in at_named)]
    if edit.kind == "add":
        added = next((f for f in unasked if (f.shape, f.color) == (edit.shape, edit.color)), None)
        done = added is not None
        if done:
            unasked.remove(added)
    elif edit.kind == "recolor":
        done = any(f.color == edit.color for f in at_named)
    else:  # remove
        done = not at_named
    # a kept object that changed is missing once; only left-overs beyond the missing ones are new objects
    total = len(kept) + max(0, len(unasked) - (len(kept) - found))
    return float(done), found / total if total else 1.0


@register("shapes_edit")
class ShapesEdit(Reward):
    """Instruction edits of shape scenes: an edit term (the asked change is there) and a preserve term (nothing
    else changed), weighted; see the module docstring."""

    accepts = ("image",)
    bounds = (0.0, 1.0)
    argument_ranges = {"edit_weight": NON_NEGATIVE, "preserve_weight": NON_NEGATIVE,
                       "position_tolerance": Range(0, 1, low_open=True), "color_tolerance": POSITIVE,
                       "min_area": FRACTION, "max_extent": Range(0, 1, low_open=True), "max_aspect": Range(1)}

    def __init__(self, edit_weight: float = EDIT_WEIGHT, preserve_weight: float = PRESERVE_WEIGHT,
                 position_tolerance: float = POSITION_TOLERANCE, color_tolerance: float = 0.35,
                 min_area: float = 0.015, max_extent: float = 0.6, max_aspect: float = 1.6):
        self.weights = check_weights(edit_weight, preserve_weight, self.name)
        if not isinstance(position_tolerance, (int, float)) or not 0 < position_tolerance <= 1:
            raise ConfigError(f"shapes_edit reward: position_tolerance must be in (0, 1] (a fraction of the frame), "
                              f"got {position_tolerance!r}")
        self.tolerance = float(position_tolerance)
        self.detector = ColourSegmentationDetector(color_tolerance, min_area, max_extent, max_aspect)

    def score(self, samples: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> RewardOutput:
        if samples.ndim != 4 or samples.shape[1] != 3:
            raise ValueError(f"shapes_edit reward: expected RGB images [B, 3, H, W], got shape {tuple(samples.shape)}")
        terms = []
        for sample, prompt, meta in zip(samples.detach().float().cpu(), prompts, metadata):
            edit = parse_instruction(prompt)
            source = placed_objects(self.detector, source_image(meta, prompt, self.name))
            try:
                terms.append(edit_terms(source, placed_objects(self.detector, sample), edit, self.tolerance))
            except ValueError as err:
                raise ConfigError(f"shapes_edit reward: instruction {prompt!r}: {err}") from None
        edit, preserve = torch.tensor(terms, dtype=torch.float32).reshape(-1, 2).unbind(dim=1)
        return edit_output(edit, preserve, self.weights)
