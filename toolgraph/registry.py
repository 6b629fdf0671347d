"""Name -> object registries. YAML names things; it never holds import paths."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from toolgraph.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}
        self._meta: dict[str, dict[str, Any]] = {}

    def register(self, name: str, **meta: Any) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"duplicate {self.kind} name {name!r}")
            self._items[name] = obj
            self._meta[name] = meta
            return obj

        return deco

    def get(self, name: str) -> T:
        if name not in self._items:
            known = ", ".join(sorted(self._items)) or "(none)"
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {known}")
        return self._items[name]

    def meta(self, name: str) -> dict[str, Any]:
        self.get(name)
        return self._meta[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


DATASETS: Registry[Callable[..., Any]] = Registry("dataset")
RETRIEVERS: Registry[type] = Registry("retriever")
TASKS: Registry[type] = Registry("task")
