"""Instruction edits of the tiny tier's shape scenes: the instruction grammar and (source, instruction, target)
triples, deterministic by ``(seed, index)`` (choices: docs/tiny.md, "Edits of shape scenes").

The grammar (``EDIT_FORMS``, the one place it is written; ``<shape>`` in ``SHAPES``, ``<colour>`` in ``COLORS``):

* ``make the <shape> <colour>``: recolour the scene's one object of that shape;
* ``add a <colour> <shape>``: add an object, anywhere it does not overlap the others;
* ``remove the <shape>``: remove the scene's one object of that shape.

``the <shape>`` names the scene's only object of that shape: the triples here give every object a different shape,
so the reference is never ambiguous. A triple's scenes reuse the shapes scenes' layout (``tiny_data``): a lone object
or a pair in separate halves of the frame, 9-12 px each, so the detector of ``rewards/shapes.py`` finds every object.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import torch

from flowzoo.errors import ConfigError
from flowzoo.models.tiny_data import (COLORS, RELATIONS, SHAPES, SHAPES_SIZE, ShapeObject, _pair_boxes,
                                      render_shapes, vocabulary)
from flowzoo.streams import TINY_EDIT_SAMPLE

#: edit kind -> the instruction's form; the one place the grammar is written (formatting and parsing both read it)
EDIT_FORMS = {
    "recolor": "make the {shape} {color}",
    "add": "add a {color} {shape}",
    "remove": "remove the {shape}",
}
EDIT_KINDS = tuple(EDIT_FORMS)


@dataclass(frozen=True)
class EditInstruction:
    kind: str  # one of EDIT_KINDS
    shape: str
    color: str | None = None  # the new colour (recolor) or the added object's (add); None for remove

    def text(self) -> str:
        return EDIT_FORMS[self.kind].format(shape=self.shape, color=self.color)


def instruction_vocabulary() -> list[str]:
    """The tiny tier's vocabulary (``tiny_data.vocabulary``) followed by the words of ``EDIT_FORMS`` it lacks, in
    their order of appearance: the edit model's tokenizer (earlier words keep their ids)."""
    words = vocabulary()
    extra = [w for form in EDIT_FORMS.values() for w in form.split() if not w.startswith("{") and w not in words]
    return words + list(dict.fromkeys(extra))


def _form_pattern(form: str) -> re.Pattern:
    words = {"shape": "|".join(SHAPES), "color": "|".join(COLORS)}
    pattern = re.escape(form)
    for field, choices in words.items():
        pattern = pattern.replace(re.escape("{" + field + "}"), f"(?P<{field}>{choices})")
    return re.compile(pattern)


_PATTERNS = {kind: _form_pattern(form) for kind, form in EDIT_FORMS.items()}


def parse_instruction(text: str) -> EditInstruction:
    """The edit an instruction asks for; a one-line ConfigError naming it and the valid forms when it is outside the
    grammar (case and surrounding spaces are ignored, inner spaces are collapsed)."""
    cleaned = " ".join(str(text).lower().split())
    for kind, pattern in _PATTERNS.items():
        match = pattern.fullmatch(cleaned)
        if match:
            return EditInstruction(kind, match["shape"], match.groupdict().get("color"))
    forms = "; ".join(f"'{form}'" for form in EDIT_FORMS.values())
    raise ConfigError(f"edit instruction {text!r} is not one of the forms {forms} (shape: {', '.join(SHAPES)}; "
                      f"colour: {', '.join(COLORS)})")


def apply_edit(objects: Sequence[ShapeObject], edit: EditInstruction,
               added_box: tuple[int, int, int, int] | None = None) -> list[ShapeObject]:
    """The scene after ``edit``: the named object recoloured or removed, or ``added_box`` holding the new object.
    A ValueError when the instruction does not name exactly one object of ``objects`` (or add lacks its box)."""
    if edit.kind == "add":
        if added_box is None:
            raise ValueError("apply_edit: an add needs the new object's box")
        return [*objects, ShapeObject(edit.shape, edit.color, added_box)]
    named = [i for i, obj in enumerate(objects) if obj.shape == edit.shape]
    if len(named) != 1:
        raise ValueError(f"instruction {edit.text()!r} names {len(named)} objects of the scene, not one")
    if edit.kind == "remove":
        return [obj for i, obj in enumerate(objects) if i != named[0]]
    return [replace(obj, color=edit.color) if i == named[0] else obj for i, obj in enumerate(objects)]


@dataclass(frozen=True)
class EditTriple:
    source: list[ShapeObject]
    instruction: str
    target: list[ShapeObject]


def sample_edit_triple(seed: int, index: int, size: int = SHAPES_SIZE) -> EditTriple:
    """Triple ``index`` of the stream ``seed``: a kind uniform over ``EDIT_KINDS``; two objects of different shapes
    and any colours in a pair layout; add starts from the first and adds the second, recolour and remove act on
    one object (a new colour for recolour) of a source holding one or both."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(index), TINY_EDIT_SAMPLE]))
    kind = EDIT_KINDS[int(rng.integers(len(EDIT_KINDS)))]
    shapes = [SHAPES[int(i)] for i in rng.permutation(len(SHAPES))[:2]]
    colors = [COLORS[int(rng.integers(len(COLORS)))] for _ in range(2)]
    boxes = _pair_boxes(rng, RELATIONS[int(rng.integers(len(RELATIONS)))], size)
    pair = [ShapeObject(shape, color, box) for shape, color, box in zip(shapes, colors, boxes)]
    if kind == "add":
        edit = EditInstruction("add", pair[1].shape, pair[1].color)
        return EditTriple(pair[:1], edit.text(), apply_edit(pair[:1], edit, pair[1].box))
    source = pair[: 1 + int(rng.integers(2))]
    named = source[int(rng.integers(len(source)))]
    if kind == "remove":
        edit = EditInstruction("remove", named.shape)
    else:
        others = [c for c in COLORS if c != named.color]
        edit = EditInstruction("recolor", named.shape, others[int(rng.integers(len(others)))])
    return EditTriple(source, edit.text(), apply_edit(source, edit))


def edit_batch(seed: int, start: int, count: int, size: int = SHAPES_SIZE
               ) -> tuple[torch.Tensor, torch.Tensor, list[str], list[dict]]:
    """Source images and target images [count, 3, size, size], instructions and metadata (``source_image``: the
    source as a [3, size, size] tensor, the prompt sources' key) of triples ``start .. start + count - 1``."""
    triples = [sample_edit_triple(seed, index, size) for index in range(start, start + count)]
    sources = torch.stack([render_shapes(t.source, size) for t in triples])
    targets = torch.stack([render_shapes(t.target, size) for t in triples])
    metadata = [{"source_image": source} for source in sources]
    return sources, targets, [t.instruction for t in triples], metadata


def edit_prompt_set(count: int, seed: int, size: int = SHAPES_SIZE) -> list[tuple[str, dict]]:
    """The first ``count`` triples of the stream ``seed`` as prompts: each instruction with its metadata, the source
    image (``source_image``, a [3, size, size] tensor in [0, 1], its own copy) and the edit kind (``tag``)."""
    sources, _, instructions, _ = edit_batch(seed, 0, count, size)
    return [(text, {"source_image": source.clone(), "tag": parse_instruction(text).kind})
            for text, source in zip(instructions, sources)]
