"""Secrets (API keys, tokens, passwords) never reach a file, a tracker or an error message.

Which config values are secret: a mapping key one of whose words (split at ``_``, ``-`` and camelCase) is ``key``,
``apikey``, ``token``, ``secret``, ``password`` or ``passwd`` (``api_key``, ``hf_token``, ``clientSecret``), plus
any name a model or reward class lists in its ``secret_args``. Whole words only: ``max_tokens`` (a count) and
``keyframes`` are not secrets. ``<name>_env`` next to a secret name (``api_key_env: MY_VAR``) is a *reference*: the
name of an environment variable read at run time; it is not secret and is stored as is.

* :func:`redact` is what ``config.yaml``, tracker configurations and reports see: every secret value becomes ``***``.
* :func:`without_secrets` is what decides whether two configs are the same run: secrets and their references are
  left out, so a run started with a literal key resumes with the key from the environment (and vice versa).
* :func:`warn_literal_secrets` prints one line per literal secret of a config, recommending the environment form.
* :func:`secret_value` resolves a class's ``(literal, <name>_env)`` pair at run time; :func:`scrub` removes secret
  values from text meant for an error message.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from flowzoo.errors import ConfigError

REDACTED = "***"
SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd"})
REFERENCE_SUFFIX = "_env"
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_warned: set[str] = set()  # dotted paths already warned about in this process


def is_secret_name(name: Any, declared: Iterable[str] = ()) -> bool:
    """Whether a config key names a secret value (its words include a secret word, or a class declared it)."""
    if not isinstance(name, str) or name.endswith(REFERENCE_SUFFIX):
        return False
    return name in set(declared) or any(word.lower() in SECRET_WORDS for word in _WORD.findall(name))


def is_secret_reference(name: Any, declared: Iterable[str] = ()) -> bool:
    """``<secret name>_env``: the name of the environment variable that holds the secret."""
    return (isinstance(name, str) and name.endswith(REFERENCE_SUFFIX)
            and is_secret_name(name[: -len(REFERENCE_SUFFIX)], declared))


def _has_value(value: Any) -> bool:
    return value is not None and value != ""


def redact(tree: Any, declared: Iterable[str] = ()) -> Any:
    """A copy of a config tree (mappings, lists, scalars) with every set secret value replaced by ``***``."""
    declared = frozenset(declared)
    if isinstance(tree, Mapping):
        return {k: REDACTED if is_secret_name(k, declared) and _has_value(v) else redact(v, declared)
                for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [redact(v, declared) for v in tree]
    return tree


def without_secrets(tree: Any, declared: Iterable[str] = ()) -> Any:
    """A copy of a config tree without secrets and their ``*_env`` references (the run's identity)."""
    declared = frozenset(declared)
    if isinstance(tree, Mapping):
        return {k: without_secrets(v, declared) for k, v in tree.items()
                if not (is_secret_name(k, declared) or is_secret_reference(k, declared))}
    if isinstance(tree, (list, tuple)):
        return [without_secrets(v, declared) for v in tree]
    return tree


def literal_secrets(tree: Any, declared: Iterable[str] = (), prefix: str = "") -> list[str]:
    """Dotted paths of the secret values written literally in a config tree (``***`` does not count)."""
    declared = frozenset(declared)
    found: list[str] = []
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            path = f"{prefix}{k}"
            if is_secret_name(k, declared):
                if _has_value(v) and v != REDACTED:
                    found.append(path)
            else:
                found += literal_secrets(v, declared, path + ".")
    return found


def warn_literal_secrets(tree: Any, declared: Iterable[str] = ()) -> list[str]:
    """One stderr line per literal secret not yet warned about in this process; returns the paths found."""
    paths = literal_secrets(tree, declared)
    for path in paths:
        if path not in _warned:
            _warned.add(path)
            name = path.rsplit(".", 1)[-1]
            print(f"flowzoo: warning: {path} is a literal secret in the config; it is never written out (runs show "
                  f"{REDACTED}), but prefer {name}{REFERENCE_SUFFIX}: VARIABLE, read from the environment at run time",
                  file=sys.stderr)
    return paths


def secret_value(literal: str | None, env: str | None, default_env: str | None, where: str, name: str) -> str | None:
    """The secret ``name`` a class uses: the literal if given, else the variable that ``<name>_env`` names (which
    must then be set), else ``default_env`` if that variable is set, else None (no secret)."""
    reference = f"{name}{REFERENCE_SUFFIX}"
    if literal == REDACTED:
        raise ConfigError(f"{where}: {name} is {REDACTED!r}, the redacted copy of a key (a run's config.yaml); "
                          f"give {reference}: VARIABLE instead")
    if _has_value(literal):
        if env:
            raise ConfigError(f"{where}: give {name} or {reference}, not both")
        return str(literal)
    if env:
        if not isinstance(env, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", env):
            raise ConfigError(f"{where}: {reference} must be an environment variable name, got {env!r}")
        if not os.environ.get(env):
            raise ConfigError(f"{where}: {reference} names the environment variable {env}, which is not set")
        return os.environ[env]
    if default_env and os.environ.get(default_env):
        return os.environ[default_env]
    return None


def scrub(text: str, *secrets: str | None) -> str:
    """``text`` with every occurrence of each (non-empty) secret replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return text
