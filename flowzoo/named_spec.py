"""The one parser of config values that are "a name or a mapping with a name": ``algorithm: flow_grpo`` or
``algorithm: {name: flow_grpo, lr: 1.0e-4}``; ``train.prompt_sampler`` and ``train.gold`` the same way."""

from __future__ import annotations

from typing import Any, Mapping

from flowzoo.errors import ConfigError


def named_spec(value: Any, refusal: str, *, optional: bool = True, string_name: bool = True) -> dict[str, Any] | None:
    """``value`` as ``{name: ..., <arguments>}``: a bare name is ``{name: name}``, a mapping holding ``name`` a copy
    of it, and None stays None when ``optional``. Anything else raises a ConfigError with ``refusal`` (the caller's
    one line: the key, what it takes, the choices). ``string_name``: the mapping's name must be a string; False
    leaves any other name to the registry, whose lookup refuses it naming the known ones."""
    if value is None and optional:
        return None
    if isinstance(value, str):
        return {"name": value}
    if not isinstance(value, Mapping) or "name" not in value or (string_name and not isinstance(value["name"], str)):
        raise ConfigError(refusal)
    return dict(value)


def split_spec(spec: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A parsed spec as (its name, its other keys: the arguments)."""
    return spec["name"], {key: value for key, value in spec.items() if key != "name"}
