"""Prompt sources of a task: lists of (prompt, metadata) for training and for evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from flowzoo.errors import ConfigError

if TYPE_CHECKING:
    from benchmark.config import PromptSection

Prompts = list[tuple[str, dict]]
SOURCES = ("toy2d",)


def check_source(section: "PromptSection") -> None:
    if section.source not in SOURCES:
        raise ConfigError(f"unknown prompt source {section.source!r}; known: {', '.join(SOURCES)}")
    for name in ("train", "test"):
        path = getattr(section, name)
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"prompts.{name}: file not found: {path}")


def load_prompts(section: "PromptSection") -> tuple[Prompts, Prompts]:
    """(training prompts, evaluation prompts)."""
    check_source(section)
    if section.source == "toy2d":
        from models.toy2d import prompt_set

        return prompt_set(), prompt_set()
    raise AssertionError(section.source)  # unreachable: check_source rejected it
