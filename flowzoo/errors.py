"""Errors meant for the user, not for a traceback.

The CLI turns any :class:`FlowZooError` into one line on stderr and a non-zero exit.
"""


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
