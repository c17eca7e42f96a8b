"""Prompt sources of a task: lists of (prompt, metadata) for training and for evaluation.

* ``toy2d``: the toy tier's class prompts (``models.toy2d.prompt_set``), the same for training and evaluation.
* ``files``: local files in Flow-GRPO's formats (``benchmark.prompt_files``): ``prompts.train`` and ``prompts.test``
  are each a ``.txt`` / ``_metadata.jsonl`` file or a folder holding ``train``/``test`` files of those names.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from flowzoo.errors import ConfigError

if TYPE_CHECKING:
    from benchmark.config import PromptSection

Prompts = list[tuple[str, dict]]
SOURCES = ("toy2d", "files")


def check_source(section: "PromptSection") -> None:
    if section.source not in SOURCES:
        raise ConfigError(f"unknown prompt source {section.source!r}; known: {', '.join(SOURCES)}")
    if section.source == "files":
        from benchmark.prompt_files import resolve_prompt_file

        for split in ("train", "test"):
            path = getattr(section, split)
            if path is None:
                raise ConfigError(f"prompts.{split}: the 'files' source needs a prompt file or folder")
            resolve_prompt_file(path, split)
    else:
        for split in ("train", "test"):
            if getattr(section, split) is not None:
                raise ConfigError(f"prompts.{split} is only used by the 'files' source, not {section.source!r}")


def load_prompts(section: "PromptSection") -> tuple[Prompts, Prompts]:
    """(training prompts, evaluation prompts)."""
    check_source(section)
    if section.source == "toy2d":
        from models.toy2d import prompt_set

        return prompt_set(), prompt_set()
    from benchmark.prompt_files import read_prompts

    train, test = read_prompts(section.train, "train"), read_prompts(section.test, "test")
    for split, prompts, path in (("train", train, section.train), ("test", test, section.test)):
        if not prompts:
            raise ConfigError(f"prompts.{split}: {path} holds no prompts")
    return train, test
