"""Config text that becomes a file name or a path: checked before anything is written.

* A **label** (``task``, a suite's name) becomes one component of a run directory's path
  (``runs/<task>/<algorithm>/s<seed>``): it must be non-empty text without a path separator, without ``.``/``..`` as
  the whole name, and without NUL or other control characters.
* A **path** (``run_dir``, ``model.args.path``, ...) may hold separators, but no NUL byte (the OS cannot take one)
  and no other control character (a newline in a path is a typo, never a directory anyone meant).
* **No string anywhere in a config** holds a NUL byte: nothing reads one as meant, and the OS rejects it with a
  ``ValueError`` far from the config key that caused it.
"""

from __future__ import annotations

import unicodedata
from typing import Any, Mapping

from flowzoo.errors import ConfigError


def _control_characters(text: str) -> list[str]:
    return sorted({repr(c)[1:-1] for c in text if unicodedata.category(c) == "Cc"})


def check_label(value: Any, where: str) -> str:
    """``value`` as a label (module docstring), or a :class:`ConfigError` naming ``where`` and the rule."""
    rule = "a name without '/', '\\', control characters, and not '.' or '..'"
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: expected {rule}, got {value!r}")
    bad = _control_characters(value)
    if bad:
        raise ConfigError(f"{where}: {value!r} holds control characters ({', '.join(bad)}); expected {rule}")
    if "/" in value or "\\" in value or value in (".", ".."):
        raise ConfigError(f"{where}: {value!r} would leave its directory; expected {rule}")
    return value


def check_path_text(value: Any, where: str) -> str:
    """``value`` as a path (module docstring), or a :class:`ConfigError` naming ``where``."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a path, got {value!r}")
    bad = _control_characters(value)
    if bad:
        raise ConfigError(f"{where}: the path {value!r} holds control characters ({', '.join(bad)}); give a plain "
                          f"path")
    return value


def reject_nul(tree: Any, where: str = "") -> None:
    """A :class:`ConfigError` naming the first key (or list index) of ``tree`` whose string (or key) holds a NUL."""
    if isinstance(tree, str):
        if "\x00" in tree:
            raise ConfigError(f"{where or 'config'}: {tree!r} holds a NUL byte (\\x00); no config value may")
    elif isinstance(tree, Mapping):
        for key, value in tree.items():
            if isinstance(key, str) and "\x00" in key:
                raise ConfigError(f"{where or 'config'}: the key {key!r} holds a NUL byte (\\x00); no config key may")
            reject_nul(value, f"{where}.{key}" if where else str(key))
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            reject_nul(value, f"{where}[{i}]")
