"""A name -> class registry used by ``algorithms``, ``models`` and ``rewards``."""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

from flowzoo.errors import ConfigError

T = TypeVar("T")


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
