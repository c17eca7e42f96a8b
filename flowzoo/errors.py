"""Errors meant for the user, not for a traceback.

Every entry point (``flowzoo`` and the older ``python -m`` spellings of its subcommands) turns an error the user can
act on (:func:`user_error`) into one line on stderr, ``flowzoo: error: ...``, and exit status 2 (:func:`one_line_errors`).
"""

import sys
from typing import Callable


class FlowZooError(Exception):
    """An error whose message alone tells the user what is wrong and what to do."""


class ConfigError(FlowZooError, ValueError):
    """A bad configuration value, name or file. The message names the bad value and the valid choices."""


class RunError(FlowZooError, RuntimeError):
    """A run directory that cannot be used: a corrupt checkpoint, a run already in progress, ..."""


def os_error_line(error: BaseException) -> str | None:
    """The one line of an OS error that names its path (a full or read-only disk, a file where a directory should
    be): ``PATH: No space left on device``; None for any other error (one without a path is a bug's traceback)."""
    if not isinstance(error, OSError) or error.filename is None:
        return None
    path = f"{error.filename} -> {error.filename2}" if error.filename2 else error.filename
    return f"{path}: {error.strerror or error}"


def user_error(error: BaseException) -> str | None:
    """The one line (exit 2) for an error the user can act on: a FlowZooError, an OS error naming its path (read-only
    or full disk, a file where a directory should be), running out of memory; None for anything else (a bug)."""
    if isinstance(error, FlowZooError):
        return str(error)
    if os_error_line(error) is not None:
        return os_error_line(error)
    if (isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError"
            or (isinstance(error, RuntimeError) and ("can't allocate memory" in str(error)
                                                     or "std::bad_alloc" in str(error)))):  # C++'s, e.g. ulimit -v
        detail = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        return (f"out of memory ({detail}); lower train.prompts_per_step, algorithm.group_size, algorithm.micro_batch "
                f"or train.eval_batch")
    return None


def one_line_errors(run: Callable[[], int]) -> int:
    """``run()``'s exit status; an error the user can act on (:func:`user_error`) is instead one line on stderr,
    ``flowzoo: error: ...``, and exit status 2. Anything else (a bug) propagates with its traceback. The one place
    every entry point's errors go through."""
    try:
        return run()
    except Exception as error:
        message = user_error(error)
        if message is None:
            raise
        print(f"flowzoo: error: {message}", file=sys.stderr)
        return 2
