"""Errors meant for the user, not for a traceback.

The CLI turns any :class:`FlowZooError` into one line on stderr and a non-zero exit.
"""


class FlowZooError(Exception):
    """An error whose message alone tells the user what is wrong and what to do."""


class ConfigError(FlowZooError, ValueError):
    """A bad configuration value, name or file. The message names the bad value and the valid choices."""


class RunError(FlowZooError, RuntimeError):
    """A run directory that cannot be used: a corrupt checkpoint, a run already in progress, ..."""
