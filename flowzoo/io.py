"""Atomic file writes: a reader (or a killed run) never sees a half-written file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable


def atomic_write(path: str | os.PathLike, write: Callable[[Any], None], mode: str = "w") -> None:
    """Write ``path`` by calling ``write(fileobj)`` on a temporary sibling, then renaming it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda f: f.write(text))


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    import torch

    atomic_write(path, lambda f: torch.save(obj, f), mode="wb")
