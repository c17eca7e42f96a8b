"""Secrets (API keys, tokens, passwords) never reach a file, a tracker or an error message.

Which config values are secret is decided by where a value goes, never by its name: a value is secret when the class
it is given to declares it a credential (``secret_args`` of a reward or model class, e.g. ``unifiedreward``'s
``api_key``), at its place in the config: ``reward_args.<reward>.<arg>`` or ``model.args.<arg>``. A prompt sampler's
``category_key`` or a reward's ``max_tokens`` is an ordinary value, stored and compared as given. A *place* is the
tuple of mapping keys that leads to the value (``("reward_args", "unifiedreward", "api_key")``). ``<arg>_env`` next
to a secret (``api_key_env: MY_VAR``) is a *reference*: the name of an environment variable read at run time; it is
not secret and is stored as is.

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
REFERENCE_SUFFIX = "_env"
Place = tuple  # the mapping keys from the root of a config tree to one value
_warned: set[str] = set()  # dotted paths already warned about in this process


def places(prefix: Iterable[str], names: Iterable[str]) -> set[Place]:
    """The places ``prefix + (name,)`` of the secret arguments ``names`` a class declares."""
    return {(*prefix, name) for name in names}


def is_reference(place: Place, secret: Iterable[Place]) -> bool:
    """``<secret>_env``: the name of the environment variable that holds the secret at ``place[:-1] + (secret,)``."""
    name = place[-1] if place else None
    return (isinstance(name, str) and name.endswith(REFERENCE_SUFFIX)
            and (*place[:-1], name[: -len(REFERENCE_SUFFIX)]) in set(secret))


def _has_value(value: Any) -> bool:
    return value is not None and value != ""


def redact(tree: Any, secret: Iterable[Place] = (), at: Place = ()) -> Any:
    """A copy of a config tree (mappings, lists, scalars) with every set secret value replaced by ``***``."""
    secret = frozenset(secret)
    if isinstance(tree, Mapping):
        return {k: REDACTED if (*at, k) in secret and _has_value(v) else redact(v, secret, (*at, k))
                for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [redact(v, secret, at) for v in tree]
    return tree


def without_secrets(tree: Any, secret: Iterable[Place] = (), at: Place = ()) -> Any:
    """A copy of a config tree without secrets and their ``*_env`` references (the run's identity)."""
    secret = frozenset(secret)
    if isinstance(tree, Mapping):
        return {k: without_secrets(v, secret, (*at, k)) for k, v in tree.items()
                if not ((*at, k) in secret or is_reference((*at, k), secret))}
    if isinstance(tree, (list, tuple)):
        return [without_secrets(v, secret, at) for v in tree]
    return tree


def literal_secrets(tree: Any, secret: Iterable[Place] = (), at: Place = ()) -> list[str]:
    """Dotted paths of the secret values written literally in a config tree (``***`` does not count)."""
    secret = frozenset(secret)
    found: list[str] = []
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            if (*at, k) in secret:
                if _has_value(v) and v != REDACTED:
                    found.append(".".join(map(str, (*at, k))))
            else:
                found += literal_secrets(v, secret, (*at, k))
    return found


def warn_literal_secrets(tree: Any, secret: Iterable[Place] = ()) -> list[str]:
    """One stderr line per literal secret not yet warned about in this process; returns the paths found."""
    paths = literal_secrets(tree, secret)
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
