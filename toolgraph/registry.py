"""Name -> object registries. YAML names things; it never holds import paths.

A registry knows the *home* of its components (the packages or modules that register them). When
a name is missing, it imports the home module named like the component (``bm25`` ->
``toolgraph.retrieval.bm25``) and, if that does not register it, every module of its home, once.
This is the one place where toolgraph imports modules by name: nothing imports a package only to
fill a registry, so loading a BM25 evaluation config imports BM25 and the layers below it, never
the training side (Lightning) or the graph side (PyG).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import pkgutil
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

    def _import_named(self, name: str) -> None:
        """Import the home module named like ``name`` (``api-bank`` -> ``api_bank``), if there is one."""
        stem = name.replace("-", "_")
        if not stem.isidentifier():
            return
        for package in self.home:
            if importlib.util.find_spec(package).submodule_search_locations is None:
                continue  # a module, not a package
            if importlib.util.find_spec(f"{package}.{stem}") is not None:
                importlib.import_module(f"{package}.{stem}")

    def _import_home(self) -> None:
        """Import every module of every home package (and the home modules themselves), once."""
        if self._home_imported:
            return
        self._home_imported = True  # first: the home's own imports may ask this registry again
        for package in self.home:
            module = importlib.import_module(package)
            for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
                importlib.import_module(f"{package}.{info.name}")

    def _lookup(self, name: str) -> None:
        if name not in self._items and not self._home_imported:
            self._import_named(name)
        if name not in self._items:
            self._import_home()

    def get(self, name: str) -> T:
        if name not in self._items:
            self._lookup(name)
        if name not in self._items:
            known = ", ".join(sorted(self._items)) or "(none)"
            close = difflib.get_close_matches(str(name), list(self._items), n=3, cutoff=0.6)
            hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
            raise ConfigError(f"unknown {self.kind} {name!r}{hint}; known: {known}")
        return self._items[name]

    def meta(self, name: str) -> dict[str, Any]:
        self.get(name)
        return self._meta[name]

    def names(self) -> list[str]:
        self._import_home()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str) and name not in self._items:
            self._lookup(name)
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


DATASETS: Registry[Callable[..., Any]] = Registry("dataset", home=("toolgraph.data.sources", "toolgraph.data.tdi"))
RETRIEVERS: Registry[type] = Registry("retriever", home="toolgraph.retrieval")
TASKS: Registry[type] = Registry("task", home="toolgraph.tasks")
