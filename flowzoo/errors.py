"""Errors raised for bad user input.

The CLI turns a :class:`ConfigError` into one line on stderr and a non-zero exit, with no traceback.
"""


class ConfigError(ValueError):
    """A bad configuration value, name or file. The message names the bad value and the valid choices."""
