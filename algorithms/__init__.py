"""Algorithm registry: ``algorithms.get(name)`` returns an Algorithm class, ``algorithms.names()`` lists them.

A new algorithm is one file in ``algorithms/methods/`` with an ``Algorithm`` subclass decorated ``@register("name")``:
this package imports every module of that folder, so the file registers itself. ``register`` gives the class its ``name`` (the
name is stated once, there) and its default ``family``. A named preset (e.g. an ablation) is a subclass whose
``preset`` dict overrides config defaults; build it with :func:`register_preset`.
"""

from __future__ import annotations

from typing import Any, Callable

from flowzoo.registry import Registry, discover

REGISTRY: Registry[type] = Registry("algorithm")
get = REGISTRY.get
names = REGISTRY.names

#: ``register_preset``'s default ``ablation_of``: the base algorithm's name
SAME_AS_BASE = "<base>"


def register(name: str) -> Callable[[type], type]:
    """Class decorator: register the class as ``name`` and set ``cls.name = name``.

    A class that also writes its own, different ``name`` is refused (hyper-parameters and recipes are looked up by
    ``cls.name``, so the two must not disagree). ``family`` defaults to the nearest registered base class's family,
    or ``name`` itself; ``ablation_of`` is None unless the class declares it."""

    def decorator(cls: type) -> type:
        own = vars(cls).get("name")
        if own is not None and own != name:
            raise ValueError(f"algorithm class {cls.__qualname__} is registered as {name!r} but declares name {own!r}; "
                             "drop its `name` attribute: @register sets it")
        cls.name = name
        if cls.family is None:
            cls.family = name
        if "ablation_of" not in vars(cls):
            cls.ablation_of = None
        REGISTRY.add(name, cls)
        return cls

    return decorator


def register_preset(name: str, base: type, overrides: dict[str, Any], doc: str, *,
                    ablation_of: str | None = SAME_AS_BASE) -> type:
    """Register ``name`` as ``base`` with config ``overrides`` applied under the user's own config.

    The preset is an ablation of ``base`` (the report's ablation table) unless ``ablation_of`` says otherwise:
    another algorithm's name, or None for a variant that is not an ablation (MixGRPO-Flash*)."""
    ablated = base.name if ablation_of == SAME_AS_BASE else ablation_of
    attributes = {"name": name, "preset": {**base.preset, **overrides}, "ablation_of": ablated, "__doc__": doc}
    cls = type(base.__name__ + "_" + name, (base,), attributes)
    REGISTRY.add(name, cls)
    return cls


def find(name: str) -> type | None:
    """The class registered as ``name``, or None (a report may read runs of an algorithm no longer registered)."""
    return REGISTRY.get(name) if name in REGISTRY else None


def ablations() -> dict[str, list[str]]:
    """{method: the registered algorithms that declare themselves its ablations}, names sorted."""
    found: dict[str, list[str]] = {}
    for name in names():
        base = get(name).ablation_of
        if base is not None:
            found.setdefault(base, []).append(name)
    return found


discover(f"{__name__}.methods", [f"{folder}/methods" for folder in __path__])

from flowzoo.algorithms.engine.base import Algorithm, AlgorithmConfig, StepStats  # noqa: E402

__all__ = ["Algorithm", "AlgorithmConfig", "StepStats", "REGISTRY", "register", "register_preset", "get", "names",
           "find", "ablations"]
