"""Seal-Tools (Wu et al., "Seal-Tools: Self-Instruct Tool Learning Dataset for Agent Tuning and
Detailed Benchmark", NLPCC 2024; github.com/fairyshine/Seal-Tools).

Catalog: ``Seal-Tools_Dataset/tool.jsonl`` (4,076 APIs). Queries: ``dev.jsonl`` (split "val") and
``test_in_domain.jsonl`` / ``test_out_domain.jsonl`` (split "test"; the source ids already start with
``test_in_domain-`` / ``test_out_domain-``, so they are kept as they are). ``train.jsonl`` is not in
the snapshot, so there is no train split.

Labels: the APIs a record calls, in call order, each once. They agree exactly (same APIs, same order)
with the authors' own retrieval labels in ``DPR_Training/*_split.json`` (checked in the tests).

Category: the tool's ``field`` ("Domain/Sub-field", the taxonomy of ``field.jsonl``). Seal-Tools has
no owner level (no tool/server grouping APIs), so ``agent`` stays empty.

Dependencies: every call lists the labels of its outputs (``"responses": ["API_call_3", ...]``,
numbered globally across the record) and a parameter whose value mentions ``API_call_k`` consumes
the output labelled k. So k is resolved through the ``responses`` lists, not read as a call index
(they differ in 13 records). The consumer's API then needs the producer's API:
``Dependency(consumer, producer, "data")``, deduplicated across the dataset. NesTools uses the same
convention and reuses :func:`call_dependencies`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

from toolgraph.data.formats import iter_jsonl
from toolgraph.data.formats import require_fields as require
from toolgraph.data.schema import SPLITS, Dependency, Query, Tool, ToolDataset
from toolgraph.data.sources._filter import QueryFilter, SkipReasons
from toolgraph.errors import ConfigError, DataError
from toolgraph.registry import DATASETS

_REF = re.compile(r"API_call_(\d+)")
_QUERY_FILES = {"dev.jsonl": ("val", "all"), "test_in_domain.jsonl": ("test", "in"),
                "test_out_domain.jsonl": ("test", "out")}
_REASONS = SkipReasons(empty_text="query with empty text", no_tools="query without calls",
                       unknown_tool="query calling an API missing from tool.jsonl",
                       repeated_tool="repeated call of an API already in the query's gold list")


def json_schema(api: dict) -> dict:
    """Seal-Tools/NesTools keep the parameter dict and the ``required`` list side by side; wrap them
    as one JSON-schema object (contents unchanged) so both survive in ``Tool.parameters``."""
    return {"type": "object", "properties": api.get("parameters") or {}, "required": api.get("required") or []}


def call_dependencies(calls: Sequence[dict], skipped: Counter) -> list[tuple[int, int]]:
    """(consumer call index, producer call index) for each ``API_call_k`` reference in ``calls``.

    A label no call produces, a call reading its own output, or a reference to the output of a
    *later* call (ill-ordered record) yields no pair and is counted in ``skipped``."""
    producer: dict[str, int] = {}
    for j, call in enumerate(calls):
        for label in call.get("responses") or []:
            producer.setdefault(str(label), j)
    pairs: list[tuple[int, int]] = []
    for i, call in enumerate(calls):
        for k in dict.fromkeys(_REF.findall(json.dumps(call.get("parameters") or {}))):
            j = producer.get(f"API_call_{k}")
            if j is None:
                skipped["API_call reference that no call produces (no edge)"] += 1
            elif j == i:
                skipped["call reading its own output (no edge)"] += 1
            elif j > i:
                skipped["reference to the output of a later call (no edge)"] += 1
            elif (i, j) not in pairs:
                pairs.append((i, j))
    return pairs


def check_dependency_splits(dependency_splits: Sequence[str] | None, dataset: str) -> set[str]:
    chosen = set(SPLITS if dependency_splits is None else dependency_splits)
    if not chosen <= set(SPLITS):
        raise ConfigError(f"{dataset}: dependency_splits {sorted(chosen)} must be within {SPLITS}")
    return chosen


def add_call_edges(calls: Sequence[dict], ids: Sequence[str], edges: dict[tuple[str, str], None],
                   skipped: Counter) -> None:
    """Add ``(consumer id, producer id)`` to ``edges`` for each pair of :func:`call_dependencies`;
    ``ids[i]`` is the tool id of call i. A tool fed by its own earlier call gives no self-edge."""
    for i, j in call_dependencies(calls, skipped):
        if ids[i] == ids[j]:
            skipped["API fed by its own earlier call (no self-edge)"] += 1
        else:
            edges[(ids[i], ids[j])] = None


def _read_catalog(path: Path, skipped: Counter) -> dict[str, Tool]:
    """tool.jsonl -> tools by API name (first kept, repeats counted)."""
    tools: dict[str, Tool] = {}
    for lineno, obj in iter_jsonl(path):
        require(obj, {"api_name": str, "api_description": str}, path, lineno, "tool")
        name = obj["api_name"].strip()
        if not name:
            raise DataError("tool: empty 'api_name'", path, lineno)
        if name in tools:
            skipped["duplicate tool name in tool.jsonl (first kept)"] += 1
            continue
        tools[name] = Tool(name, name, obj["api_description"], category=obj.get("field") or None,
                           parameters=json_schema(obj), returns=obj.get("responses"))
    return tools


def _checked_queries(path: Path) -> Iterator[tuple[dict, list[str]]]:
    """Each query record of ``path`` with the API names it calls, in order; DataError(file:line) on a bad one."""
    for lineno, obj in iter_jsonl(path):
        require(obj, {"id": str, "query": str, "calling": list}, path, lineno, "query")
        for call in obj["calling"]:
            require(call, {"api": str}, path, lineno, "call")
        yield obj, [c["api"] for c in obj["calling"]]


@DATASETS.register("seal-tools")
def load_seal_tools(root: Path, test: str = "all", dependency_splits: Sequence[str] | None = None) -> ToolDataset:
    """Seal-Tools: 4,076 tools, dev (val) and in/out-of-domain test; dependencies from API_call_k.

    ``test``: which test file(s) to load (all | in | out). ``dependency_splits``: the splits whose
    call chains yield dependency edges (default all; note that test chains are test labels)."""
    if test not in ("all", "in", "out"):
        raise ConfigError(f"seal-tools: option test={test!r}; expected 'all', 'in' or 'out'")
    dep_splits = check_dependency_splits(dependency_splits, "seal-tools")
    folder = root / "seal-tools" / "Seal-Tools_Dataset"
    skipped: Counter = Counter()
    tools_path = folder / "tool.jsonl"
    tools = _read_catalog(tools_path, skipped)

    filt = QueryFilter(_REASONS, skipped)
    queries: list[Query] = []
    edges: dict[tuple[str, str], None] = {}
    files_read = [str(tools_path)]
    for fname, (split, which) in _QUERY_FILES.items():
        path = folder / fname
        if split == "test" and test not in ("all", which):
            skipped[f"{fname} query left out by option test={test!r}"] += sum(1 for _ in iter_jsonl(path))
            continue
        files_read.append(str(path))
        for obj, apis in _checked_queries(path):
            if filt.reject(obj["query"], apis, tools):
                continue
            queries.append(Query(obj["id"], obj["query"], filt.gold(apis), split))
            if split in dep_splits:
                add_call_edges(obj["calling"], apis, edges, skipped)

    deps = [Dependency(s, t, "data") for s, t in edges]
    notes = {"files": files_read, "test": test, "dependency_splits": sorted(dep_splits)}
    return ToolDataset("seal-tools", list(tools.values()), queries, [], deps, +skipped, notes)
