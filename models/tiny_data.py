"""Synthetic data of the tiny tier, generated on the fly and deterministic by seed (choices: docs/tiny.md).

* ``shapes``: 32x32 RGB scenes on a black background with one or two solid circles / squares / triangles in four
  well-separated colours, and a GenEval-style prompt whose metadata (``tag``, ``include``, ``exclude``) is the record
  that ``rewards.geneval.geneval_checks`` scores. Tags: ``colors`` (one object), ``counting`` (two of a kind),
  ``two_object`` and ``position`` (two different objects; ``position`` fixes their relation).
* ``glyphs``: 2-3 characters (uppercase letters but O and I, and digits) rendered white on a black 16x48 strip; the prompt is
  the text in double quotes, as Flow-GRPO's OCR prompts (``'the text "AB3"'``).

Each sample is a pure function of ``(seed, index)`` (numpy ``SeedSequence``), so a batch does not depend on how
samples are grouped, and evaluation prompts are the first N samples of a fixed seed.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from flowzoo.streams import TINY_SAMPLE

SHAPES_SIZE = 32
SHAPES = ("circle", "square", "triangle")
#: RGB in [0, 1]; hues 0/60/130/225 deg, far apart so a nearest-colour rule separates them
PALETTE = {
    "red": (0.90, 0.12, 0.12),
    "yellow": (0.95, 0.85, 0.10),
    "green": (0.10, 0.78, 0.22),
    "blue": (0.15, 0.30, 0.95),
}
COLORS = tuple(PALETTE)
RELATIONS = ("left of", "right of", "above", "below")
NUMBER_WORDS = {1: "a", 2: "two"}
#: tag -> probability of a training scene
TAG_WEIGHTS = {"colors": 0.4, "counting": 0.2, "two_object": 0.2, "position": 0.2}
SINGLE_SIZE = (11, 15)  # side of the bounding box in pixels, one object
PAIR_SIZE = (9, 12)  # two objects
MARGIN = 1
PAIR_JITTER = 3  # pixels between the two objects along the axis their relation does not name

GLYPH_HEIGHT, GLYPH_WIDTH = 16, 48
#: characters the tokenizer knows (fixed: the vocabulary, and so the text encoder's shape, must not change)
TOKEN_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
#: characters drawn on glyph strips: O/0 and I/1 look alike in Pillow's default font, so O and I are left out
GLYPH_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"
GLYPH_LENGTHS = (2, 3)
GLYPH_FONT_SIZE = 14

DATASETS = ("shapes", "glyphs")


@dataclass(frozen=True)
class ShapeObject:
    shape: str
    color: str
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 (inclusive corners, as PIL draws them)


def sample_rng(seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(index), TINY_SAMPLE]))


# ---- shapes ------------------------------------------------------------------------------------------------
def plural(shape: str, count: int) -> str:
    return shape if count == 1 else shape + "s"


def shapes_prompt_and_metadata(tag: str, objects: Sequence[ShapeObject], relation: str | None = None) -> tuple[str, dict]:
    """The prompt and GenEval record of a scene (``relation`` of objects[1] to objects[0] for ``position``)."""
    first = objects[0]
    if tag == "colors":
        prompt = f"a {first.color} {first.shape}"
        include = [{"class": first.shape, "count": 1, "color": first.color}]
        return prompt, {"tag": tag, "include": include, "exclude": [], "prompt": prompt}
    if tag == "counting":
        prompt = f"two {first.color} {plural(first.shape, 2)}"
        include = [{"class": first.shape, "count": 2, "color": first.color}]
        exclude = [{"class": first.shape, "count": 3}]
        return prompt, {"tag": tag, "include": include, "exclude": exclude, "prompt": prompt}
    second = objects[1]
    include = [{"class": first.shape, "count": 1, "color": first.color},
               {"class": second.shape, "count": 1, "color": second.color}]
    if tag == "two_object":
        prompt = f"a {first.color} {first.shape} and a {second.color} {second.shape}"
    else:
        include[1]["position"] = [relation, 0]
        prompt = f"a {second.color} {second.shape} {relation} a {first.color} {first.shape}"
    return prompt, {"tag": tag, "include": include, "exclude": [], "prompt": prompt}


def _place(rng: np.random.Generator, side: int, size: int, region: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """A box of ``side`` pixels whose top-left corner is uniform in ``region`` (x_lo, x_hi, y_lo, y_hi), clipped."""
    x_lo, x_hi, y_lo, y_hi = region
    hi = size - MARGIN - side
    x0 = int(rng.integers(max(MARGIN, x_lo), max(MARGIN, min(hi, x_hi)) + 1))
    y0 = int(rng.integers(max(MARGIN, y_lo), max(MARGIN, min(hi, y_hi)) + 1))
    return (x0, y0, x0 + side - 1, y0 + side - 1)


def _pair_boxes(rng: np.random.Generator, relation: str, size: int) -> list[tuple[int, int, int, int]]:
    """Two non-overlapping boxes, box 2 in ``relation`` to box 1: each in its own half, and along the other axis
    within ``PAIR_JITTER`` pixels of each other, so GenEval's centre rule sees the relation unambiguously."""
    sides = [int(rng.integers(PAIR_SIZE[0], PAIR_SIZE[1] + 1)) for _ in range(2)]
    half = size // 2
    second_first = relation in ("left of", "above")  # box 2 takes the low half (left / top)
    low_side, high_side = (sides[1], sides[0]) if second_first else (sides[0], sides[1])
    along = [int(rng.integers(MARGIN, half - low_side)), int(rng.integers(half + 1, size - MARGIN - high_side + 1))]
    across = int(rng.integers(MARGIN, size - MARGIN - max(sides) + 1))
    across = [across, int(np.clip(across + rng.integers(-PAIR_JITTER, PAIR_JITTER + 1), MARGIN, size - MARGIN - max(sides)))]
    horizontal = relation in ("left of", "right of")
    boxes = []
    for start, other, side in zip(along, across, (low_side, high_side)):
        x0, y0 = (start, other) if horizontal else (other, start)
        boxes.append((x0, y0, x0 + side - 1, y0 + side - 1))
    return boxes[::-1] if second_first else boxes


def sample_shapes_scene(seed: int, index: int, size: int = SHAPES_SIZE) -> tuple[list[ShapeObject], str, dict]:
    """Scene ``index`` of the stream ``seed``: objects, prompt and GenEval metadata."""
    rng = sample_rng(seed, index)
    tags = list(TAG_WEIGHTS)
    tag = tags[int(rng.choice(len(tags), p=list(TAG_WEIGHTS.values())))]
    shape = SHAPES[int(rng.integers(len(SHAPES)))]
    color = COLORS[int(rng.integers(len(COLORS)))]
    relation = RELATIONS[int(rng.integers(len(RELATIONS)))]
    if tag == "colors":
        side = int(rng.integers(SINGLE_SIZE[0], SINGLE_SIZE[1] + 1))
        objects = [ShapeObject(shape, color, _place(rng, side, size, (0, size, 0, size)))]
        return objects, *shapes_prompt_and_metadata(tag, objects)
    boxes = _pair_boxes(rng, relation, size)
    if tag == "counting":
        objects = [ShapeObject(shape, color, box) for box in boxes]
    else:
        other_shape = SHAPES[(SHAPES.index(shape) + 1 + int(rng.integers(len(SHAPES) - 1))) % len(SHAPES)]
        other_color = COLORS[(COLORS.index(color) + 1 + int(rng.integers(len(COLORS) - 1))) % len(COLORS)]
        objects = [ShapeObject(shape, color, boxes[0]), ShapeObject(other_shape, other_color, boxes[1])]
    return objects, *shapes_prompt_and_metadata(tag, objects, relation if tag == "position" else None)


def draw_shape(draw: ImageDraw.ImageDraw, obj: ShapeObject) -> None:
    fill = tuple(int(round(255 * c)) for c in PALETTE[obj.color])
    x0, y0, x1, y1 = obj.box
    if obj.shape == "circle":
        draw.ellipse(obj.box, fill=fill)
    elif obj.shape == "square":
        draw.rectangle(obj.box, fill=fill)
    elif obj.shape == "triangle":  # apex up
        draw.polygon([((x0 + x1) / 2, y0), (x1, y1), (x0, y1)], fill=fill)
    else:
        raise ValueError(f"unknown shape {obj.shape!r}")


def render_shapes(objects: Sequence[ShapeObject], size: int = SHAPES_SIZE) -> torch.Tensor:
    """[3, size, size] float in [0, 1], black background."""
    image = Image.new("RGB", (size, size), (0, 0, 0))
    draw = ImageDraw.Draw(image)
    for obj in objects:
        draw_shape(draw, obj)
    return pil_to_tensor(image)


def pil_to_tensor(image: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1).contiguous()


# ---- glyphs ------------------------------------------------------------------------------------------------
_FONT: ImageFont.FreeTypeFont | ImageFont.ImageFont | None = None


def glyph_font() -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """Pillow's built-in scalable font (shipped inside Pillow, so rendering is the same on every machine)."""
    global _FONT
    if _FONT is None:
        _FONT = ImageFont.load_default(size=GLYPH_FONT_SIZE)
    return _FONT


def sample_glyph_text(seed: int, index: int) -> str:
    rng = sample_rng(seed, index)
    length = int(rng.choice(GLYPH_LENGTHS))
    return "".join(GLYPH_ALPHABET[int(i)] for i in rng.integers(len(GLYPH_ALPHABET), size=length))


def glyph_prompt(text: str) -> str:
    return f'the text "{text}"'


def render_glyphs(text: str, height: int = GLYPH_HEIGHT, width: int = GLYPH_WIDTH) -> torch.Tensor:
    """[3, height, width] float in [0, 1]: ``text`` in white, centred on black."""
    image = Image.new("RGB", (width, height), (0, 0, 0))
    draw = ImageDraw.Draw(image)
    font = glyph_font()
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    origin = ((width - (right - left)) / 2 - left, (height - (bottom - top)) / 2 - top)
    draw.text(origin, text, fill=(255, 255, 255), font=font)
    return pil_to_tensor(image)


# ---- batches -----------------------------------------------------------------------------------------------
def sample_prompt(data: str, seed: int, index: int) -> tuple[str, dict]:
    """Prompt and metadata of sample ``index`` (no rendering)."""
    if data == "shapes":
        _, prompt, meta = sample_shapes_scene(seed, index)
        return prompt, meta
    if data == "glyphs":
        text = sample_glyph_text(seed, index)
        return glyph_prompt(text), {"text": text}
    raise ValueError(f"unknown tiny dataset {data!r}; known: {', '.join(DATASETS)}")


def sample_batch(data: str, seed: int, start: int, count: int) -> tuple[torch.Tensor, list[str], list[dict]]:
    """Images [count, 3, H, W] in [0, 1], prompts and metadata of samples ``start .. start + count - 1``."""
    images, prompts, metadata = [], [], []
    for index in range(start, start + count):
        if data == "shapes":
            objects, prompt, meta = sample_shapes_scene(seed, index)
            images.append(render_shapes(objects))
        elif data == "glyphs":
            text = sample_glyph_text(seed, index)
            prompt, meta = glyph_prompt(text), {"text": text}
            images.append(render_glyphs(text))
        else:
            raise ValueError(f"unknown tiny dataset {data!r}; known: {', '.join(DATASETS)}")
        prompts.append(prompt)
        metadata.append(meta)
    return torch.stack(images), prompts, metadata


def image_shape(data: str) -> tuple[int, int, int]:
    if data == "shapes":
        return (3, SHAPES_SIZE, SHAPES_SIZE)
    if data == "glyphs":
        return (3, GLYPH_HEIGHT, GLYPH_WIDTH)
    raise ValueError(f"unknown tiny dataset {data!r}; known: {', '.join(DATASETS)}")


def vocabulary() -> list[str]:
    """Every word a tiny prompt can contain (both datasets), in a fixed order: the tokenizer's vocabulary."""
    words = ["a", "two", "and", "the", "text", '"']
    words += list(SHAPES) + [plural(s, 2) for s in SHAPES] + list(COLORS)
    words += [w for r in RELATIONS for w in r.split() if w not in words]
    words += [c.lower() for c in TOKEN_CHARS]
    return list(dict.fromkeys(words))


#: fixed seeds of the prompt sets: training prompts and the held-out evaluation prompts never share a stream
TRAIN_PROMPT_SEED = 1
EVAL_PROMPT_SEED = 2
VALIDATION_PROMPT_SEED = 3  # flowzoo tune's trials: drawn apart, then held out from the evaluation prompts' texts
PRETRAIN_DATA_SEED = 0


def prompt_set(data: str, count: int, seed: int) -> list[tuple[str, dict]]:
    """The first ``count`` (prompt, metadata) pairs of the stream ``seed``. Repeats are kept, so the tags keep the
    training distribution's proportions (the shapes prompt space is small: 12 + 12 + 72 + 288 prompts).

    A pure function of its arguments, memoised per process (each config build asks for the same two sets: drawing
    them took ~0.1 s a build, seconds for a suite's expansion); the caller gets its own copy of the metadata."""
    if count > _MEMO_MAX_PROMPTS:
        return [sample_prompt(data, seed, index) for index in range(count)]
    return copy.deepcopy(list(_prompt_set(data, count, seed)))


#: the largest prompt set memoised (the tier's sets hold ~1000)
_MEMO_MAX_PROMPTS = 65_536


@functools.lru_cache(maxsize=16)
def _prompt_set(data: str, count: int, seed: int) -> tuple[tuple[str, dict], ...]:
    return tuple(sample_prompt(data, seed, index) for index in range(count))
