"""A name -> class registry used by ``algorithms``, ``models`` and ``rewards``, and :func:`discover`, the one way a
registry's package finds its modules."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, Generic, Iterable, TypeVar

from flowzoo.errors import ConfigError

T = TypeVar("T")


def discover(package: str, path: Iterable[str]) -> list[str]:
    """Import every module of ``package`` (whose ``__path__`` is ``path``), in name order, so each module registers
    what it defines: a new file in a registry's folder is found without being listed anywhere. Returns the
    modules' names. Call it at the end of the package's ``__init__``, after ``register`` is defined."""
    found = sorted(info.name for info in pkgutil.iter_modules(path))
    for name in found:
        importlib.import_module(f"{package}.{name}")
    return found


class Registry(Generic[T]):
    """Maps names to classes (or factories). ``kind`` is used in error messages ("algorithm", "model", ...)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            self.add(name, obj)
            return obj

        return decorator

    def register_class(self, name: str) -> Callable[[T], T]:
        """Class decorator: register the class as ``name`` and set its ``name`` attribute, the one place a registered
        class's name is written; a class that declares its own, different ``name`` is refused."""
        def decorator(cls: T) -> T:
            own = vars(cls).get("name")
            if own is not None and own != name:
                raise ValueError(f"{self.kind} class {cls.__qualname__} is registered as {name!r} but declares name "
                                 f"{own!r}; drop its `name` attribute: @register sets it")
            cls.name = name
            self.add(name, cls)
            return cls

        return decorator

    def add(self, name: str, obj: T) -> None:
        if name in self._entries and self._entries[name] is not obj:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = obj

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries
