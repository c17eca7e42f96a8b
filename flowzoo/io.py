"""Atomic file writes: a reader (or a killed run) never sees a half-written file."""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from flowzoo.errors import RunError

_UMASK = os.umask(0o022)  # read once at import (os.umask can only be read by setting it), then put back
os.umask(_UMASK)


def atomic_write(path: str | os.PathLike, write: Callable[[Any], None], mode: str = "w") -> None:
    """Write ``path`` by calling ``write(fileobj)`` on a temporary sibling, then renaming it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the permissions open() would
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


class exclusive_lock:
    """An advisory lock file held for the life of a ``with`` block; a second holder fails at once.

    Two processes that would write the same run directory (two suites pointed at one results directory, a run
    started twice) cannot interleave their writes: the second gets a clear error instead.
    """

    def __init__(self, path: str | os.PathLike, what: str = "this directory"):
        self.path = Path(path)
        self.what = what
        self._fd: int | None = None

    def __enter__(self) -> "exclusive_lock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = None
            raise RunError(f"{self.what} is being written by another process (lock {self.path})") from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
