"""NesTools (Han et al., "NesTools: A Dataset for Evaluating Nested Tool Learning Abilities of Large
Language Models", COLING 2025; github.com/hhan1018/NesTools).

Test only: ``data/test_data.jsonl`` holds 1,000 tasks, each with its gold ``api`` list (full schemas)
and a ``call`` sequence. The authors' API pool (``api_dic.json``) is not in the snapshot, so the
catalog is the union of the APIs the tasks define.

Tool ids. NesTools generated APIs per task, and names collide: 177 names carry 2+ different
definitions (different descriptions and parameters), 235 extra definitions in all, and no two
definitions are identical. The authors' pool keeps them apart: ``inference/build_test_prompt/
test_api_ids.jsonl`` gives, per task, the pool id of each entry of its ``api`` list (position i ->
id i, as the authors' ``make_test_prompt.py`` reads it), all 3,034 distinct. So by default
(``tool_ids="pool"``) a tool's id is its pool id and its ``name`` the API name; merging by name would
give 235 gold labels another task's definition. ``tool_ids="name"`` dedupes by name instead (first
definition kept, later conflicting ones counted in ``skipped``, their queries pointed at the kept one).

Labels: the APIs called, in call order, each once. Category: the task's ``field``. No owner level,
so no agents. Dependencies: ``API_call_k`` references resolved through the calls' ``responses``
labels (see ``seal_tools.call_dependencies``) -> ``Dependency(consumer, producer, "data")``, deduped.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

from toolgraph.data.formats import iter_jsonl
from toolgraph.data.schema import Dependency, Query, Tool, ToolDataset
from toolgraph.data.sources._filter import QueryFilter, SkipReasons
from toolgraph.data.sources.seal_tools import add_call_edges, check_dependency_splits, json_schema, require
from toolgraph.errors import ConfigError, DataError
from toolgraph.registry import DATASETS

_REASONS = SkipReasons(empty_text="task with empty text", no_tools="task without calls",
                       unknown_tool="call naming an API outside the task's api list",
                       repeated_tool="repeated call of an API already in the task's gold list")


def _read_pool_ids(path: Path) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for lineno, obj in iter_jsonl(path):
        require(obj, {"test_id": int, "api_ids": list}, path, lineno)
        if obj["test_id"] in out:
            raise DataError(f"duplicate test_id {obj['test_id']}", path, lineno)
        out[obj["test_id"]] = obj["api_ids"]
    return out


def _checked_tasks(path: Path, pool: dict[int, list[int]] | None,
                   ids_path: Path) -> Iterator[tuple[int, dict, list[str]]]:
    """Each task of ``path`` with the tool id of each entry of its ``api`` list: its pool id, or its
    API name when ``pool`` is None. DataError(file:line) on a bad record or a task the pool does not fit."""
    for lineno, obj in iter_jsonl(path):
        require(obj, {"test_id": int, "task": str, "api": list, "call": list}, path, lineno, "task")
        for api in obj["api"]:
            require(api, {"api_name": str, "api_description": str}, path, lineno, "api")
        for call in obj["call"]:
            require(call, {"api_name": str}, path, lineno, "call")
        tid = obj["test_id"]
        if pool is None:
            yield lineno, obj, [api["api_name"] for api in obj["api"]]
            continue
        if tid not in pool:
            raise DataError(f"test_id {tid} has no line in {ids_path.name}", path, lineno)
        if len(pool[tid]) != len(obj["api"]):
            raise DataError(f"test_id {tid}: {len(obj['api'])} APIs but {len(pool[tid])} ids in {ids_path.name}",
                            path, lineno)
        yield lineno, obj, [str(i) for i in pool[tid]]


class _Catalog:
    """The union of the tasks' API definitions by tool id. Another definition under a known id is an
    error for pool ids; for name ids the first is kept and the conflict counted."""

    def __init__(self, by_pool: bool, skipped: Counter) -> None:
        self.by_pool, self.skipped = by_pool, skipped
        self.tools: dict[str, Tool] = {}
        self.definition: dict[str, str] = {}  # tool id -> canonical JSON of its definition
        self.name_conflicts: set[str] = set()

    def add_task(self, obj: dict, ids: list[str], path: Path, lineno: int) -> dict[str, str]:
        """Add a task's APIs; return API name -> tool id within the task."""
        local: dict[str, str] = {}
        for api, id_ in zip(obj["api"], ids):
            name = api["api_name"]
            if name in local:
                raise DataError(f"test_id {obj['test_id']}: API {name!r} defined twice in one task", path, lineno)
            local[name] = id_
            text = json.dumps(api, sort_keys=True)
            if id_ not in self.tools:
                self.tools[id_] = Tool(id_, name, api["api_description"], category=obj.get("field") or None,
                                       parameters=json_schema(api), returns=api.get("responses"))
                self.definition[id_] = text
            elif self.definition[id_] == text:
                self.skipped["API defined again identically by a later task (kept once)"] += 1
            elif self.by_pool:
                raise DataError(f"test_id {obj['test_id']}: pool id {id_} names two different API definitions",
                                path, lineno)
            else:
                self.skipped["API name redefined with a different schema (first definition kept)"] += 1
                self.name_conflicts.add(name)
        return local

    def conflicting_names(self) -> int:
        if not self.by_pool:
            return len(self.name_conflicts)
        return sum(c > 1 for c in Counter(t.name for t in self.tools.values()).values())


@DATASETS.register("nestools")
def load_nestools(root: Path, tool_ids: str = "pool", dependency_splits: Sequence[str] | None = None) -> ToolDataset:
    """NesTools (COLING'25): 1,000 nested-call test tasks; dependencies from API_call_k.

    ``tool_ids``: "pool" (authors' API ids, default) or "name" (dedupe by API name)."""
    if tool_ids not in ("pool", "name"):
        raise ConfigError(f"nestools: option tool_ids={tool_ids!r}; expected 'pool' or 'name'")
    dep_splits = check_dependency_splits(dependency_splits, "nestools")
    folder = root / "nestools"
    data_path = folder / "data" / "test_data.jsonl"
    ids_path = folder / "inference" / "build_test_prompt" / "test_api_ids.jsonl"
    pool = _read_pool_ids(ids_path) if tool_ids == "pool" else None
    skipped: Counter = Counter()
    catalog = _Catalog(tool_ids == "pool", skipped)
    filt = QueryFilter(_REASONS, skipped)
    queries: list[Query] = []
    edges: dict[tuple[str, str], None] = {}
    for lineno, obj, ids in _checked_tasks(data_path, pool, ids_path):
        local = catalog.add_task(obj, ids, data_path, lineno)
        names = [c["api_name"] for c in obj["call"]]
        if filt.reject(obj["task"], names, local):
            continue
        called = [local[n] for n in names]
        queries.append(Query(str(obj["test_id"]), obj["task"], filt.gold(called), "test"))
        if "test" in dep_splits:
            add_call_edges(obj["call"], called, edges, skipped)

    deps = [Dependency(s, t, "data") for s, t in edges]
    notes = {"files": [str(data_path)] + ([str(ids_path)] if tool_ids == "pool" else []), "tool_ids": tool_ids,
             "dependency_splits": sorted(dep_splits), "names_with_conflicting_definitions": catalog.conflicting_names()}
    return ToolDataset("nestools", list(catalog.tools.values()), queries, [], deps, +skipped, notes)
