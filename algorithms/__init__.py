"""Algorithm registry: ``algorithms.get(name)`` returns an Algorithm class, ``algorithms.names()`` lists them.

A new algorithm is one file with an ``Algorithm`` subclass decorated ``@register("name")`` plus one import line
below. A named preset (e.g. an ablation) is a subclass whose ``preset`` dict overrides config defaults; build it
with :func:`register_preset`.
"""

from __future__ import annotations

from typing import Any

from flowzoo.registry import Registry

REGISTRY: Registry[type] = Registry("algorithm")
register = REGISTRY.register
get = REGISTRY.get
names = REGISTRY.names


def register_preset(name: str, base: type, overrides: dict[str, Any], doc: str) -> type:
    """Register ``name`` as ``base`` with config ``overrides`` applied under the user's own config."""
    cls = type(base.__name__ + "_" + name, (base,), {"name": name, "preset": {**base.preset, **overrides}, "__doc__": doc})
    REGISTRY.add(name, cls)
    return cls


from algorithms import flow_grpo  # noqa: E402,F401
from algorithms import dance_grpo  # noqa: E402,F401
from algorithms import mix_grpo  # noqa: E402,F401
from algorithms import flow_grpo_fast  # noqa: E402,F401
from algorithms import op_grpo  # noqa: E402,F401
from algorithms.base import Algorithm, AlgorithmConfig, StepStats  # noqa: E402

__all__ = ["Algorithm", "AlgorithmConfig", "StepStats", "REGISTRY", "register", "register_preset", "get", "names"]
