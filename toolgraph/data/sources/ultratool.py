"""UltraTool as reformatted by GNN4TaskPlan (Wu et al., "Can Graph Learning Improve Planning in LLM-based
Agents?", NeurIPS 2024; github.com/WxxShirley/GNN4TaskPlan), from UltraTool (Huang et al., Findings of ACL 2024).

Files (``ultratool-gnn4taskplan/data/ultratool/``): ``data.json`` (JSONL, 3,527 requests, each with ordered
``task_nodes`` and chain ``task_links``), ``tool_desc.json`` (260 tools with a short ``desc`` and a ``domain``
list), ``split_ids.json`` (the 500 test ids; the rest is train, val carved from it), ``user_requests.json``
(3,538 requests: the 11 without a plan in ``data.json`` are counted in ``skipped``) and ``graph_desc.json``.

Labels: the ``task_nodes`` tools, in order, each once (48 repeats in 39 requests, counted in ``skipped``).
``task_steps`` are not kept as ``Query.steps``: they spell out the tool ("Step 1 Call clock_alarm_cancel
to ...") and 328 requests have more steps than nodes.

Dependencies: a link A -> B means A runs before B, so ``Dependency(B, A, "sequence")``, deduplicated over the
requests of ``dependency_splits`` (default all; test links are test labels); ``notes["dependency_support"]``
gives ``[source, target, #requests]``. A link from a tool to itself (a repeated call; 47 in all) gives no edge.
``graph_desc.json``'s links are the same kind of edge (the GNN4TaskPlan tool graph, the dedup of task_links,
apparently over an earlier version of the data): 596 edges shared, 10 only in the graph, 2 only in data.json,
plus the same 5 self-loops; ``dependency_source="graph"`` uses them instead (whole dataset, no split filter).

Tool text: the reformat renamed/merged many UltraTool tools (e.g. ``hotel_search`` -> ``search_hotels``) and
kept a short ``desc``. Where the original English test (``ultratool/data/English-dataset/test.json``) defines a
tool of the same name (184 of 260), ``parameters``/``returns`` come from the original schema and the
description from whichever text is longer: 157 are identical, 17 were extended by GNN4TaskPlan (kept), 10 are
longer in the original (taken; ``notes["descriptions_from_original"]``). ``category`` = the ``domain`` list
joined by ", ". No owner level, so no agents.

Overlap with ``ultratool-original``: 639 requests have the same text (whitespace-normalized) as an original
test question (ids 2897-3537: the original test is the tail of the reformat): 550 in the reformat's train
split, 89 in its test split. Test ones are kept; all are listed in ``notes["original_overlap_ids"]``; with
``dedupe_original=True`` (default) the train ones are dropped (counted in ``skipped``) before val is carved, so
training here and testing on ``ultratool-original`` does not leak.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from toolgraph.data.schema import Dependency, Query, Tool, ToolDataset
from toolgraph.data.sources._filter import QueryFilter, SkipReasons
from toolgraph.data.sources.seal_tools import check_dependency_splits
from toolgraph.data.sources.ultratool_original import LANG_PATHS, normalize_text, read_original
from toolgraph.data.sources.ultratool_read import (
    Request,
    read_links,
    read_request_ids,
    read_requests,
    read_test_ids,
    read_tools,
)
from toolgraph.data.splits import carve_val
from toolgraph.errors import ConfigError, DataError
from toolgraph.registry import DATASETS

_FOLDER = "ultratool-gnn4taskplan/data/ultratool"
_REASONS = SkipReasons(empty_text="request with empty text", no_tools="request without task nodes",
                       unknown_tool="request using a tool missing from tool_desc.json",
                       repeated_tool="repeated call of a tool already in the request's gold list")


def _tools(nodes: list[dict], defs: dict[str, dict], path: Path) -> tuple[list[Tool], int, int]:
    """Tools from tool_desc.json nodes, enriched from the original test's definitions ``defs``;
    also how many were enriched and how many took the original's (longer) description."""
    tools: list[Tool] = []
    enriched = longer = 0
    for node in nodes:
        name, desc, orig = node["id"], node["desc"].strip(), defs.get(node["id"])
        if orig is not None:
            enriched += 1
            if len(orig["description"].strip()) > len(desc):
                desc, longer = orig["description"].strip(), longer + 1
        category = ", ".join(node.get("domain") or []) or None
        tools.append(Tool(name, name, desc, category=category, parameters=orig and orig.get("arguments"),
                          returns=orig and orig.get("results")))
    if len({t.id for t in tools}) != len(tools):
        raise DataError("duplicate tool id in 'nodes'", path)
    return tools, enriched, longer


def _links(request: Request, skipped: Counter) -> list[tuple[str, str]]:
    """The request's task links as (needs, needed) pairs, once each; self- and outside links counted."""
    pairs: dict[tuple[str, str], None] = {}
    for src, dst in request.links:
        if src == dst:
            skipped["task link from a tool to itself (no self-edge)"] += 1
        elif src not in request.names or dst not in request.names:
            skipped["task link naming a tool outside the request's nodes (no edge)"] += 1
        else:
            pairs[(dst, src)] = None  # src runs first: dst needs src
    return list(pairs)


def _queries(requests: list[Request], test_ids: set[str], known: set[str], original_texts: set[str],
             dedupe_original: bool, skipped: Counter
             ) -> tuple[list[Query], dict[str, list[tuple[str, str]]], dict[str, list[str]]]:
    """Queries (train/test by split_ids.json), each kept request's links, and the ids (by split) of
    requests whose text is an original test question."""
    filt = QueryFilter(_REASONS, skipped)
    queries: list[Query] = []
    links: dict[str, list[tuple[str, str]]] = {}  # request id -> its (needs, needed) pairs
    overlap: dict[str, list[str]] = {"train": [], "test": []}
    for r in requests:
        split = "test" if r.id in test_ids else "train"
        if filt.reject(r.text, r.names, known):
            continue
        if normalize_text(r.text) in original_texts:
            overlap[split].append(r.id)
            if split == "train" and dedupe_original:
                skipped["train request also in the original UltraTool test (dedupe_original)"] += 1
                continue
        queries.append(Query(r.id, r.text, filt.gold(r.names), split))
        links[r.id] = _links(r, skipped)
    return queries, links, overlap


def _graph_edges(path: Path, known: set[str], skipped: Counter) -> Counter:
    edges: Counter = Counter()
    for src, dst in read_links(path):
        if src not in known or dst not in known:
            skipped["graph link naming an unknown tool (no edge)"] += 1
        elif src == dst:
            skipped["graph link from a tool to itself (no self-edge)"] += 1
        else:
            edges[(dst, src)] += 1
    return edges


@DATASETS.register("ultratool")
def load_ultratool(root: Path, val_fraction: float = 0.1, seed: int = 0, dedupe_original: bool = True,
                   dependency_source: str = "links", dependency_splits: Sequence[str] | None = None) -> ToolDataset:
    """GNN4TaskPlan's UltraTool (260 tools, 3,527 requests, 500 test). ``dependency_source``: "links"
    (data.json task_links, default) or "graph" (graph_desc.json links)."""
    if dependency_source not in ("links", "graph"):
        raise ConfigError(f"ultratool: option dependency_source={dependency_source!r}; expected 'links' or 'graph'")
    if dependency_source == "graph" and dependency_splits is not None:
        raise ConfigError("ultratool: dependency_splits applies to dependency_source='links' only")
    dep_splits = check_dependency_splits(dependency_splits, "ultratool")
    folder = root / _FOLDER
    skipped: Counter = Counter()

    # read and check, in this order: original test, tool_desc, split_ids, data, user_requests
    orig_path = root / LANG_PATHS["en"]
    records, defs, _ = read_original(orig_path, Counter())  # its own skips belong to ultratool-original
    tools, enriched, longer = _tools(read_tools(folder / "tool_desc.json"), defs, folder / "tool_desc.json")
    test_ids = read_test_ids(folder / "split_ids.json")
    data_path, requests_path = folder / "data.json", folder / "user_requests.json"
    requests = read_requests(data_path)

    # assemble
    known = {t.id for t in tools}
    queries, links, overlap = _queries(requests, test_ids, known, {normalize_text(r.question) for r in records},
                                       dedupe_original, skipped)
    seen = {r.id for r in requests}
    skipped["split_ids.json test id without a record in data.json"] += len(test_ids - seen)
    skipped["request in user_requests.json without a plan in data.json"] += sum(
        i not in seen for i in read_request_ids(requests_path))
    queries = carve_val(queries, val_fraction, seed)
    if dependency_source == "links":
        edges = Counter(pair for q in queries if q.split in dep_splits for pair in links[q.id])
    else:
        edges = _graph_edges(folder / "graph_desc.json", known, skipped)
    deps = [Dependency(s, t, "sequence") for s, t in edges]
    notes = {"files": [str(data_path), str(folder / "tool_desc.json"), str(folder / "split_ids.json"),
                       str(requests_path), str(orig_path)]
             + ([str(folder / "graph_desc.json")] if dependency_source == "graph" else []),
             "val_fraction": val_fraction, "seed": seed, "dedupe_original": dedupe_original,
             "dependency_source": dependency_source, "dependency_splits": sorted(dep_splits),
             "tools_enriched_from_original": enriched, "descriptions_from_original": longer,
             # requests whose text is an original test question, by their split_ids.json side (train = train+val)
             "original_overlap_ids": {s: sorted(ids, key=lambda i: (len(i), i)) for s, ids in overlap.items()}}
    if dependency_source == "links":  # [source, target, #requests with that link]
        notes["dependency_support"] = [[s, t, c] for (s, t), c in edges.items()]
    return ToolDataset("ultratool", tools, queries, [], deps, +skipped, notes)
