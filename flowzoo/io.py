"""Atomic file writes: a reader (or a killed run) never sees a half-written file, and an output folder is never left
half-written (:func:`staged_directory`). An OS error while writing always names the path it was writing (a full
disk's ``write()`` raises one without a path), so the command line turns it into one line and exit 2."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from filelock import FileLock, Timeout

from flowzoo.errors import ConfigError, RunError

_UMASK = os.umask(0o022)  # read once at import (os.umask can only be read by setting it), then put back
os.umask(_UMASK)


#: how torch's zip writer reports a failed write (a full disk) instead of an OSError
_TORCH_WRITE_FAILED = ("PytorchStreamWriter failed writing", "file write failed", "unexpected pos")


@contextlib.contextmanager
def naming(path: str | os.PathLike) -> Iterator[None]:
    """Within the block an OS error without a path (``write()`` on a full disk: ``OSError(ENOSPC)``), or torch's
    writer failing, is raised again as an ``OSError`` naming ``path``."""
    try:
        yield
    except OSError as error:
        if error.filename is not None:
            raise
        raise OSError(error.errno, error.strerror or str(error) or type(error).__name__, str(path)) from error
    except RuntimeError as error:
        if not any(text in str(error) for text in _TORCH_WRITE_FAILED):
            raise
        raise OSError(None, f"write failed (a full disk?): {str(error).strip().splitlines()[0][:160]}",
                      str(path)) from error


def atomic_write(path: str | os.PathLike, write: Callable[[Any], None], mode: str = "w") -> None:
    """Write ``path`` by calling ``write(fileobj)`` on a temporary sibling, then renaming it into place; an OS error
    names ``path`` (:func:`naming`)."""
    path = Path(path)
    _check_file_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with naming(path):
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


def _check_file_target(path: Path) -> None:
    """An ``OSError`` naming ``path`` when it cannot become a file: it is a directory (the rename would name a
    temporary file instead), or a folder above it is a file."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory; give a file path", str(path))
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, f"is a file, so {path} cannot be written under it",
                                         str(parent))
            return


def refuse_input_as_output(out: str | os.PathLike, inputs: list[str | os.PathLike], what: str = "--out") -> None:
    """A one-line ConfigError when the output file ``out`` is one of the command's ``inputs`` (the same file, however
    named): writing it would replace what the command reads."""
    target = Path(out).resolve()
    for source in inputs:
        if Path(source).resolve() == target:
            raise ConfigError(f"{what} {str(out)!r} is the command's input {str(source)!r}: writing it would replace "
                              f"what it reads; give another file")


def check_out_dir(out: str | os.PathLike, what: str = "--out") -> Path:
    """``out`` as a Path; ``ConfigError`` when it exists and is not a directory (before any work)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        from flowzoo.errors import ConfigError

        raise ConfigError(f"{what} {str(out)!r} is a file, not a directory; give a directory")
    return out


@contextlib.contextmanager
def staged_directory(out: str | os.PathLike, what: str = "--out") -> Iterator[Path]:
    """An output folder written all or nothing: yields a fresh temporary sibling of ``out`` to write into. On success
    the stage becomes ``out`` (renamed, when ``out`` did not exist) or its files are moved into ``out`` one rename
    each (other files there are kept); on any error the stage is removed, ``out`` is as it was, and an OS error
    names the path under ``out`` it was writing."""
    out = check_out_dir(out, what)
    anchor = out.absolute()  # "." has no name and is its own parent: the stage goes beside the folder it names
    anchor.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{anchor.name}.partial-", dir=anchor.parent))
    try:
        with _mapped(stage, out):
            yield stage
            os.chmod(stage, 0o777 & ~_UMASK)  # mkdtemp makes 0700; give the folder mkdir's permissions
            if not out.exists():
                os.replace(stage, out)
                return
            for source in sorted(p for p in stage.rglob("*") if not p.is_dir()):
                target = out / source.relative_to(stage)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(source, target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


@contextlib.contextmanager
def _mapped(stage: Path, out: Path) -> Iterator[None]:
    """An OS error naming a path in ``stage`` (or none) names the same path under ``out``."""
    try:
        with naming(out):
            yield
    except OSError as error:
        name = str(error.filename)
        if not name.startswith(str(stage)):
            raise
        raise OSError(error.errno, error.strerror, str(out) + name[len(str(stage)):]) from error


def file_digest(path: str | os.PathLike) -> str:
    """The first 16 hex digits of a file's sha256: what identifies a file by its bytes (a pretrain checkpoint's
    ``--init`` file, an edit prompt's source image in ``flowzoo eval --out``)."""
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


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
