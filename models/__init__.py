"""Model registry: ``models.get(name)`` returns a FlowModel class, ``models.names()`` lists them.

A new model is one file in this package with a ``FlowModel`` subclass decorated ``@register("name")``: the package
imports every module in it, so the file registers itself (docs/adding-a-model.md). ``register`` gives the class its
``name`` (stated once, there). What the harness needs to know about a model (its sample kind, defaults, argument
ranges, export format, ...) are attributes of its class, never tables keyed by its name elsewhere.

Modules that need heavy libraries (diffusers, transformers) import them inside the adapter, so that importing
``models`` stays cheap.
"""

from __future__ import annotations


from flowzoo.registry import Registry, discover
from flowzoo.models.base import Condition, FlowModel

REGISTRY: Registry[type[FlowModel]] = Registry("model")
register = REGISTRY.register_class  # sets the class's `name`
get = REGISTRY.get
names = REGISTRY.names

discover(__name__, __path__)

__all__ = ["Condition", "FlowModel", "REGISTRY", "register", "get", "names"]
