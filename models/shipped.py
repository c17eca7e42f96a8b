"""The shipped files (``models/weights/``) are read-only to every command.

No run, pretrain checkpoint, export, evaluation, report or recipe table may be written into that directory or over
one of its files. The one exception is ``flowzoo pretrain --out`` naming one of the shipped weights files exactly
(``models/weights/tiny_<data>.safetensors``): that is how the shipped weights are retrained on purpose.
Paths are compared after resolving symbolic links and ``..``, so no spelling of the directory gets past.
"""

from __future__ import annotations

import os
from pathlib import Path

from flowzoo.errors import ConfigError


def weights_dir() -> Path:
    """The shipped-weights directory (read at call time: tests point it at a scratch copy)."""
    from flowzoo.models import tiny

    return tiny.WEIGHTS_DIR.resolve()


def is_shipped(path: str | os.PathLike) -> bool:
    """``path`` is the shipped-weights directory, a file in it, or anything below it."""
    target, shipped = Path(path).resolve(), weights_dir()
    return target == shipped or shipped in target.parents


def refuse_shipped(path: str | os.PathLike, what: str, hint: str = "choose another path") -> None:
    """A one-line :class:`ConfigError` if ``path`` (``what`` names the option or key that gave it) would write into
    the shipped-weights directory (or cannot be a path at all: a NUL byte)."""
    if "\x00" in str(path):
        raise ConfigError(f"{what} {str(path)!r}: a path cannot hold a NUL byte")
    if is_shipped(path):
        raise ConfigError(f"{what} {str(path)!r} is inside the shipped weights directory {weights_dir()}, which no "
                          f"command writes into; {hint}")

