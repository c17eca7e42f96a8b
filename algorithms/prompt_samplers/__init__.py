"""Prompt-sampler registry: ``algorithms.prompt_samplers.get(name)`` returns a :class:`PromptSampler` class,
``names()`` lists them, ``build(spec, pool, groups, seed)`` makes one from a config's ``train.prompt_sampler``.

A new sampler is one file in this package with a ``PromptSampler`` subclass decorated ``@register("name")``. The
hook and its contract: ``base.py``.
"""

from __future__ import annotations

from typing import Any, Mapping

from flowzoo.algorithms.prompt_samplers.base import GroupOutcome, Pool, PromptDraw, PromptSampler, SamplerConfig
from flowzoo.named_spec import named_spec, split_spec
from flowzoo.registry import Registry, discover
from flowzoo.schema import from_mapping

REGISTRY: Registry[type] = Registry("prompt sampler")
get = REGISTRY.get
names = REGISTRY.names
register = REGISTRY.register_class


def spec_of(value: str | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``train.prompt_sampler`` as ``{name: ..., <arguments>}`` (a bare name is ``{name: name}``); None stays None."""
    return named_spec(value, f"train.prompt_sampler: give a sampler name or {{name: ..., <arguments>}}, got "
                             f"{value!r}; samplers: {', '.join(names())}")


def typed_config(spec: Mapping[str, Any]) -> tuple[type[PromptSampler], SamplerConfig]:
    """The sampler class of ``spec`` and its typed arguments (unknown names and keys refused in one line)."""
    name, args = split_spec(spec)
    cls = get(name)
    return cls, from_mapping(cls.Config, args, where=f"train.prompt_sampler ({name})")


def build(spec: Mapping[str, Any], pool: Pool, groups: int, seed: int) -> PromptSampler:
    cls, config = typed_config(spec)
    return cls(pool, groups, seed, config)


def check(spec: Mapping[str, Any], pool: Pool, groups: int) -> None:
    """Everything ``build`` would refuse, without building: the name, the arguments, the pool."""
    cls, config = typed_config(spec)
    cls.check_pool(pool, groups, config)


discover(__name__, __path__)

__all__ = ["GroupOutcome", "Pool", "PromptDraw", "PromptSampler", "SamplerConfig", "REGISTRY", "get", "names",
           "register", "spec_of", "typed_config", "build", "check"]
