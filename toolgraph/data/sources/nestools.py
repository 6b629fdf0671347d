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
from collections.abc import Sequence
from pathlib import Path

from toolgraph.data.formats import iter_jsonl
from toolgraph.data.schema import Dependency, Query, Tool, ToolDataset
from toolgraph.data.sources.seal_tools import call_dependencies, check_dependency_splits, json_schema, require
from toolgraph.errors import ConfigError, DataError
from toolgraph.registry import DATASETS


def _read_pool_ids(path: Path) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for lineno, obj in iter_jsonl(path):
        require(obj, {"test_id": int, "api_ids": list}, path, lineno)
        if obj["test_id"] in out:
            raise DataError(f"duplicate test_id {obj['test_id']}", path, lineno)
        out[obj["test_id"]] = obj["api_ids"]
    return out


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
    pool = _read_pool_ids(ids_path) if tool_ids == "pool" else {}
    skipped: Counter = Counter()
    tools: dict[str, Tool] = {}
    definition: dict[str, str] = {}  # tool id -> canonical JSON of its definition
    name_conflicts: set[str] = set()
    queries: list[Query] = []
    edges: dict[tuple[str, str], None] = {}

    for lineno, obj in iter_jsonl(data_path):
        require(obj, {"test_id": int, "task": str, "api": list, "call": list}, data_path, lineno, "task")
        for api in obj["api"]:
            require(api, {"api_name": str, "api_description": str}, data_path, lineno, "api")
        for call in obj["call"]:
            require(call, {"api_name": str}, data_path, lineno, "call")
        tid = obj["test_id"]
        if tool_ids == "pool":
            if tid not in pool:
                raise DataError(f"test_id {tid} has no line in {ids_path.name}", data_path, lineno)
            if len(pool[tid]) != len(obj["api"]):
                raise DataError(f"test_id {tid}: {len(obj['api'])} APIs but {len(pool[tid])} ids in {ids_path.name}",
                                data_path, lineno)
            ids = [str(i) for i in pool[tid]]
        else:
            ids = [api["api_name"] for api in obj["api"]]

        local: dict[str, str] = {}  # API name -> tool id, within this task
        for api, id_ in zip(obj["api"], ids):
            name = api["api_name"]
            if name in local:
                raise DataError(f"test_id {tid}: API {name!r} defined twice in one task", data_path, lineno)
            local[name] = id_
            text = json.dumps(api, sort_keys=True)
            if id_ not in tools:
                tools[id_] = Tool(id_, name, api["api_description"], category=obj.get("field") or None,
                                  parameters=json_schema(api), returns=api.get("responses"))
                definition[id_] = text
            elif definition[id_] == text:
                skipped["API defined again identically by a later task (kept once)"] += 1
            elif tool_ids == "pool":
                raise DataError(f"test_id {tid}: pool id {id_} names two different API definitions", data_path, lineno)
            else:
                skipped["API name redefined with a different schema (first definition kept)"] += 1
                name_conflicts.add(name)

        names = [c["api_name"] for c in obj["call"]]
        if not obj["task"].strip():
            skipped["task with empty text"] += 1
            continue
        if not names:
            skipped["task without calls"] += 1
            continue
        if any(n not in local for n in names):
            skipped["call naming an API outside the task's api list"] += 1
            continue
        gold = tuple(dict.fromkeys(local[n] for n in names))
        skipped["repeated call of an API already in the task's gold list"] += len(names) - len(gold)
        queries.append(Query(str(tid), obj["task"], gold, "test"))
        if "test" in dep_splits:
            for i, j in call_dependencies(obj["call"], skipped):
                if names[i] == names[j]:
                    skipped["API fed by its own earlier call (no self-edge)"] += 1
                else:
                    edges[(local[names[i]], local[names[j]])] = None

    deps = [Dependency(s, t, "data") for s, t in edges]
    notes = {"files": [str(data_path)] + ([str(ids_path)] if tool_ids == "pool" else []), "tool_ids": tool_ids,
             "dependency_splits": sorted(dep_splits),
             "names_with_conflicting_definitions": len(name_conflicts) if tool_ids == "name" else
             sum(c > 1 for c in Counter(t.name for t in tools.values()).values())}
    return ToolDataset("nestools", list(tools.values()), queries, [], deps, +skipped, notes)
