"""Prompt datasets from local files in Flow-GRPO's formats (its ``dataset/`` folder):

* ``{split}.txt`` - one prompt a line (pickscore, ocr, drawbench); metadata ``{}``, as Flow-GRPO's
  ``TextPromptDataset`` gives.
* ``{split}_metadata.jsonl`` - GenEval: one JSON object a line with ``tag``, ``include``, ``exclude`` (optional in
  the released file), ``prompt``; the whole object is the prompt's metadata, as Flow-GRPO's
  ``GenevalPromptDataset`` gives.
* edit pairs: a ``.jsonl`` whose objects also carry ``image``, the path of the source image (relative to the file's
  folder, or absolute), with ``prompt`` the instruction, as Flow-GRPO's image-editing datasets pair them. The path is
  resolved and checked at read time and given as ``metadata["source_image"]`` (``flowzoo.source_images``), the key
  the edit models read; a missing or unreadable image is a one-line error naming the file and line.

``path`` is either such a file or a folder holding ``{split}_metadata.jsonl`` or ``{split}.txt`` (the jsonl wins,
as it carries the metadata). Blank lines are skipped.

The files are read with the standard library, not ``datasets``: ``load_dataset("json")`` unifies the records' keys
into one Arrow schema, so on Flow-GRPO's GenEval file 1,892 of the 2,212 records come back with an ``exclude: None``
the file does not have, and the GenEval reward's ``metadata.get("exclude", [])`` then iterates ``None`` (measured
with datasets 5.2 on the released ``geneval/test_metadata.jsonl``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from flowzoo.errors import ConfigError
from flowzoo.source_images import SOURCE_IMAGE, check_image_file


def resolve_prompt_file(path: str | os.PathLike, split: str = "train") -> Path:
    """The prompt file for ``split``: ``path`` itself if it is a file, else ``path/{split}_metadata.jsonl`` or
    ``path/{split}.txt``."""
    root = Path(path).expanduser()
    if root.is_file():
        if root.suffix not in (".txt", ".jsonl"):
            raise ConfigError(f"prompt file {str(root)!r} must end in .txt or .jsonl")
        return root
    candidates = [root / f"{split}_metadata.jsonl", root / f"{split}.txt"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    if not root.is_dir():
        raise ConfigError(f"prompt path {str(root)!r} does not exist")
    names = " or ".join(c.name for c in candidates)
    raise ConfigError(f"prompt folder {str(root)!r} has no {names} for split {split!r}")


def read_prompts(path: str | os.PathLike, split: str = "train") -> list[tuple[str, dict]]:
    """``[(prompt, metadata), ...]`` in file order."""
    file = resolve_prompt_file(path, split)
    rows: list[tuple[str, dict]] = []
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"prompt file {str(file)!r} is not UTF-8 text (byte {err.start}: {err.reason})") from None
    except OSError as err:
        raise ConfigError(f"cannot read prompt file {str(file)!r} ({err.strerror or err})") from None
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.strip()
        if not line:
            continue
        if file.suffix == ".txt":
            rows.append((line, {}))
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{file}:{number}: not valid JSON ({err.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
            raise ConfigError(f"{file}:{number}: expected a JSON object with a string 'prompt' field")
        if "image" in record:
            record[SOURCE_IMAGE] = _source_path(record["image"], file, number)
        rows.append((record["prompt"], record))
    if not rows:
        raise ConfigError(f"prompt file {str(file)!r} holds no prompts")
    return rows



def _source_path(image, file: Path, number: int) -> str:
    """The absolute path of an edit pair's ``image`` (relative to the prompt file's folder), checked to be an image."""
    where = f"{file}:{number}"
    if not isinstance(image, str) or not image:
        raise ConfigError(f"{where}: 'image' must be the path of the source image (a non-empty string), got {image!r}")
    path = (file.parent / Path(image).expanduser()).resolve()
    check_image_file(path, where)
    return str(path)
