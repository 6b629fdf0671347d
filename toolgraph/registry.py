"""Name -> object registries. YAML names things; it never holds import paths.

A registry knows the *home* of its components (the package or modules that register them). When a
name is missing, it imports its home by name once and looks again. This is the one place where
toolgraph imports modules by name: nothing imports a package only to fill a registry, so loading
an evaluation config never pulls in the training side (Lightning) or the graph side (PyG).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from toolgraph.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, home: str | tuple[str, ...] = ()):
        self.kind = kind
        self.home = (home,) if isinstance(home, str) else tuple(home)
        self._home_imported = False
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

    def _import_home(self) -> None:
        if self._home_imported:
            return
        self._home_imported = True  # first: the home's own imports may ask this registry again
        for module in self.home:
            importlib.import_module(module)

    def get(self, name: str) -> T:
        if name not in self._items:
            self._import_home()
        if name not in self._items:
            known = ", ".join(sorted(self._items)) or "(none)"
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {known}")
        return self._items[name]

    def meta(self, name: str) -> dict[str, Any]:
        self.get(name)
        return self._meta[name]

    def names(self) -> list[str]:
        self._import_home()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        if name not in self._items:
            self._import_home()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


DATASETS: Registry[Callable[..., Any]] = Registry("dataset", home=("toolgraph.data.sources", "toolgraph.data.tdi"))
RETRIEVERS: Registry[type] = Registry("retriever", home="toolgraph.retrieval")
TASKS: Registry[type] = Registry("task", home="toolgraph.tasks")
