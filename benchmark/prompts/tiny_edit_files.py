"""The tiny edit tier's prompts as edit-pair files: what the ``files`` prompt source reads (``benchmark/prompts/files.py``).

``write_edit_pairs`` writes the first ``count`` edit triples of a stream (``models.tiny_edit_data.edit_prompt_set``),
or the chosen ``indices`` of them, as one PNG per source image and one ``.jsonl`` of Flow-GRPO's edit-pair form
(``prompt`` the instruction, ``image`` the source's path relative to the file) with the edit kind (``tag``) and the
triple's provenance (``stream_seed``, ``index``). The scenes' pixels are multiples of 1/255, so a PNG holds them
exactly and a model reading the file sees the tensor the ``tiny_edit`` source gives (tested).

This is how a task of a few chosen edits is made (``benchmark/prompts/tiny_edit_rare.jsonl``, docs/tiny.md), as
``flowzoo edit-pairs``:

    flowzoo edit-pairs --split train --count 64 --out DIR
    flowzoo edit-pairs --split train --count 64 --indices 3,17 --out DIR --name F
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

from flowzoo.errors import ConfigError
from flowzoo.io import atomic_write, atomic_write_text

#: the tiny edit source's splits -> their stream seeds (models.tiny_data: training, held-out evaluation, validation)
SPLITS = ("train", "test", "validation")


def split_seed(split: str) -> int:
    from flowzoo.models.tiny_data import EVAL_PROMPT_SEED, TRAIN_PROMPT_SEED, VALIDATION_PROMPT_SEED

    seeds = dict(zip(SPLITS, (TRAIN_PROMPT_SEED, EVAL_PROMPT_SEED, VALIDATION_PROMPT_SEED)))
    if split not in seeds:
        raise ConfigError(f"unknown split {split!r}; choose one of: {', '.join(SPLITS)}")
    return seeds[split]


def write_edit_pairs(out: str | Path, split: str = "train", count: int = 64, indices: Sequence[int] | None = None,
                     name: str = "pairs") -> Path:
    """Write the triples ``indices`` (default: all) of the first ``count`` of ``split``'s stream to ``out``: images
    ``out/<name>/<index>.png`` and the pair file ``out/<name>.jsonl``; return the pair file's path. A bad count or
    index is a one-line ConfigError naming it and the valid range; every file is written atomically."""
    import numpy as np
    from PIL import Image

    from flowzoo.models.tiny_edit_data import edit_prompt_set

    seed = split_seed(split)
    if count < 1:
        raise ConfigError(f"count must be at least 1, got {count}")
    chosen = list(range(count)) if indices is None else list(indices)
    bad = [i for i in chosen if not 0 <= i < count]
    if bad or not chosen or len(set(chosen)) != len(chosen):
        raise ConfigError(f"indices {chosen} must be distinct and in [0, {count - 1}] (the first {count} triples)")
    if not name or "/" in name:
        raise ConfigError(f"name {name!r} must be a plain file name (no '/')")
    prompts = edit_prompt_set(count, seed)
    root = Path(out)
    (root / name).mkdir(parents=True, exist_ok=True)
    lines = []
    for i in chosen:
        text, meta = prompts[i]
        pixels = (meta["source_image"].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        image = root / name / f"{i:04d}.png"
        atomic_write(image, lambda f: Image.fromarray(pixels).save(f, format="PNG"), mode="wb")
        lines.append(json.dumps({"prompt": text, "image": f"{name}/{image.name}", "tag": meta["tag"],
                                 "stream_seed": seed, "index": i}))
    pair_file = root / f"{name}.jsonl"
    atomic_write_text(pair_file, "\n".join(lines) + "\n")
    return pair_file


DESCRIPTION = ("The first COUNT triples of a split's stream (or the chosen --indices of them) as NAME.jsonl (prompt,\n"
               "image, tag, stream_seed, index) and NAME/<index>.png under OUT: what prompts.source=files reads.")


def _indices(text: str) -> list[int]:
    try:
        return [int(i) for i in text.split(",") if i.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``flowzoo edit-pairs``'s arguments."""
    parser.add_argument("--split", default="train", help=f"the stream: {', '.join(SPLITS)}")
    parser.add_argument("--count", type=int, default=64, help="the first COUNT triples of the stream")
    parser.add_argument("--indices", type=_indices, default=None, help="comma-separated indices among them "
                        "(default: all)")
    parser.add_argument("--out", required=True, help="folder written: NAME.jsonl and NAME/<index>.png")
    parser.add_argument("--name", default="pairs", help="the pair file's and image folder's name")


def run(args: argparse.Namespace) -> int:
    """``flowzoo edit-pairs``: write the pairs, print the pair file's path."""
    print(write_edit_pairs(args.out, args.split, args.count, args.indices, args.name))
    return 0
