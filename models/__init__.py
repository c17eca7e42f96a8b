"""Model registry: ``models.get(name)`` returns a FlowModel class, ``models.names()`` lists them.

Modules that need heavy libraries (diffusers, transformers) import them inside the adapter, so that importing
``models`` stays cheap.
"""

from __future__ import annotations

from flowzoo.registry import Registry
from models.base import Condition, FlowModel

REGISTRY: Registry[type[FlowModel]] = Registry("model")
register = REGISTRY.register_class  # sets the class's `name`
get = REGISTRY.get
names = REGISTRY.names

from models import toy2d  # noqa: E402,F401
from models import sd3, wan  # noqa: E402,F401
from models import flux, qwen_image  # noqa: E402,F401
from models import tiny  # noqa: E402,F401

__all__ = ["Condition", "FlowModel", "REGISTRY", "register", "get", "names"]
