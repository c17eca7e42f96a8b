"""Atomic file writes: a reader (or a killed run) never sees a half-written file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from filelock import FileLock, Timeout

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
    """A lock file held for the life of a ``with`` block; a second holder fails at once.

    Two processes that would write the same run directory (two suites pointed at one results directory, a run
    started twice) cannot interleave their writes: the second gets a clear error instead. ``filelock`` picks the
    platform's lock (``flock`` on POSIX, ``msvcrt`` on Windows); the lock goes with the process if it is killed.
    """

    def __init__(self, path: str | os.PathLike, what: str = "this directory"):
        self.path = Path(path)
        self.what = what
        self._lock: FileLock | None = None

    def __enter__(self) -> "exclusive_lock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(self.path, timeout=0)  # timeout 0: try once, never wait
        try:
            lock.acquire()
        except Timeout:
            raise RunError(f"{self.what} is being written by another process (lock {self.path})") from None
        self._lock = lock
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
