"""Reward registry.

``rewards.get(name)`` returns a reward class, ``rewards.names()`` lists them, ``rewards.build(spec)`` makes the
reward a config asks for: a name, or a mapping ``{name: weight}`` combined by :class:`MultiReward`.

A new reward is one file in this package with a ``Reward`` subclass decorated ``@register("name")``: the package
imports every module in it, so the file registers itself. Heavy libraries are imported inside the rewards that use
them, so that importing ``rewards`` stays cheap.
"""

from __future__ import annotations

from typing import Any, Mapping

from flowzoo.errors import ConfigError
from flowzoo.registry import Registry, discover
from flowzoo.rewards.base import Reward, RewardOutput
from flowzoo.rewards.multi import MultiReward

REGISTRY: Registry[type[Reward]] = Registry("reward")
register = REGISTRY.register_class  # sets the class's `name`
get = REGISTRY.get
names = REGISTRY.names


def _weights(spec: str | Mapping[str, float]) -> dict[str, float]:
    """A config's ``reward``: a name is that reward at weight 1; a mapping is ``{name: weight}``."""
    return {spec: 1.0} if isinstance(spec, str) else dict(spec)


def build(spec: str | Mapping[str, float], args: Mapping[str, Mapping[str, Any]] | None = None) -> Reward:
    """The reward of a config: ``"name"`` or ``{"name": weight, ...}``; ``args[name]`` are constructor kwargs."""
    args = dict(args or {})
    weights = _weights(spec)
    if not weights:
        raise ConfigError("reward: give a reward name or a mapping {name: weight}")
    unused = set(args) - set(weights)
    if unused:
        raise ConfigError(f"reward_args names {sorted(unused)}, which are not rewards of this config {sorted(weights)}")
    built: dict[str, Reward] = {}
    for name, weight in weights.items():
        cls = get(name)
        if not isinstance(weight, (int, float)):
            raise ConfigError(f"reward weight of {name!r} must be a number, got {weight!r}")
        try:
            built[name] = cls(**args.get(name, {}))
        except TypeError as e:
            given = args.get(name)  # names only: a credential given to the wrong reward stays unshown
            names = sorted(map(str, given)) if isinstance(given, Mapping) else f"({type(given).__name__})"
            raise ConfigError(f"reward {name!r}: bad arguments {names}: {e}") from None
    if isinstance(spec, str):
        return built[spec]
    return MultiReward(built, weights)


def bounds(spec: str | Mapping[str, float]) -> tuple[float, float] | None:
    """The closed range of a config's reward scores: the class's ``bounds`` for a name; for ``{name: weight}`` the
    weighted sum's (MultiReward), or None when any component declares none."""
    low = high = 0.0
    for name, weight in _weights(spec).items():
        component = get(name).bounds
        if component is None:
            return None
        ends = (float(weight) * component[0], float(weight) * component[1])
        low, high = low + min(ends), high + max(ends)
    return low, high


discover(__name__, __path__)

__all__ = ["Reward", "RewardOutput", "MultiReward", "REGISTRY", "register", "get", "names", "build", "bounds"]
