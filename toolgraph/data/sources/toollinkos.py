"""ToolLinkOS (Lumer et al., "Graph RAG-Tool Fusion", arXiv 2502.07223, 2025;
github.com/EliasLumer/Graph-RAG-Tool-Fusion-ToolLinkOS).

Catalog: ``core_tools.json`` (50 core tools such as get_current_date) + ``regular_tools.json``
(523 tools), fictional OS/app functions. Each tool lists ``depends_on`` entries (tool name,
``dependence_type``, parameter, reason); each becomes ``Dependency(tool, depended-on tool,
dependence_type)``. Two entries of one tool naming the same target with the same type (e.g. two
parameters fed by the same converter) become one edge; the merge is counted in ``skipped``.

Queries: ``instances.json`` (1,569, no ids: the id is the record index). Gold = the main tool
first, then the rest of ``golden_function_names`` in source order. The source calls
golden_function_names the main tool plus its dependency closure; we check that claim and store
the counts in ``notes["closure"]`` (it holds for 1,047 queries; for the other 522 the gold set is a
strict subset of the closure, missing only core tools). ``notes["main_tool"]`` maps query id ->
main tool, for the "main tool + prerequisites" protocol.

No split exists: a seeded query-level split (``seeded_assign``; test 0.2, val 0.1, train the rest).
Category = ``func_type`` (core | regular); there is no owner level, so no agents.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from toolgraph.data.formats import read_json, require_fields
from toolgraph.data.schema import Dependency, Query, Tool, ToolDataset
from toolgraph.data.sources._filter import QueryFilter, SkipReasons
from toolgraph.data.splits import seeded_assign
from toolgraph.errors import ConfigError, DataError
from toolgraph.registry import DATASETS

_REASONS = SkipReasons(empty_text="query with empty text", unknown_tool="query naming a tool missing from the catalog",
                       repeated_tool="tool repeated in golden_function_names")
Edge = tuple[str, str, str]  # (tool, the tool it depends on, dependence_type)


def _records(path: Path) -> list[Any]:
    data = read_json(path)
    if not isinstance(data, list):
        raise DataError(f"expected a JSON array, got {type(data).__name__}", path)
    return data


def _closure(main: str, needs: dict[str, list[str]]) -> set[str]:
    seen, stack = {main}, [main]
    while stack:
        for nxt in needs.get(stack.pop(), []):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def _read_catalog(folder: Path, skipped: Counter) -> tuple[dict[str, Tool], list[tuple[str, dict]]]:
    """core_tools.json then regular_tools.json: tools by name (first kept) and their checked
    ``depends_on`` entries as (tool name, entry)."""
    tools: dict[str, Tool] = {}
    raw_deps: list[tuple[str, dict]] = []
    for fname in ("core_tools.json", "regular_tools.json"):
        path = folder / fname
        for i, obj in enumerate(_records(path)):
            where = f"record {i}"
            require_fields(obj, {"name": str, "description": str}, path, what=where)
            name = obj["name"].strip()
            if not name:
                raise DataError(f"{where}: empty 'name'", path)
            if name in tools:
                skipped["tool name defined twice (first kept)"] += 1
                continue
            deps = obj.get("depends_on") or []
            if not isinstance(deps, list):
                raise DataError(f"{where} ({name}): 'depends_on' must be a list", path)
            for k, dep in enumerate(deps):
                require_fields(dep, {"name": str, "dependence_type": str}, path, what=f"{where} ({name}) depends_on[{k}]")
                raw_deps.append((name, dep))
            tools[name] = Tool(name, name, obj["description"], category=obj.get("func_type") or None,
                               parameters=obj.get("parameters"))
    return tools, raw_deps


def _edges(tools: dict[str, Tool], raw_deps: list[tuple[str, dict]], skipped: Counter
           ) -> tuple[dict[Edge, None], dict[str, list[str]]]:
    """Typed edges (once each) and, per tool, the tools it needs (for the closure check)."""
    edges: dict[Edge, None] = {}
    needs: dict[str, list[str]] = {}
    for name, dep in raw_deps:
        target, kind = dep["name"], dep["dependence_type"]
        if target not in tools:
            skipped["depends_on naming an unknown tool"] += 1
        elif target == name:
            skipped["tool depending on itself"] += 1
        elif (name, target, kind) in edges:
            skipped["depends_on entry merged into an edge with the same tool, target and type"] += 1
        else:
            edges[(name, target, kind)] = None
            if target not in needs.setdefault(name, []):
                needs[name].append(target)
    return edges, needs


def _instances(path: Path, tools: dict[str, Tool], needs: dict[str, list[str]], skipped: Counter
               ) -> tuple[list[tuple[str, str, tuple[str, ...]]], dict[str, str], Counter]:
    """instances.json -> kept (id, text, gold), the main tool per id, and the closure counts."""
    filt = QueryFilter(_REASONS, skipped)
    kept: list[tuple[str, str, tuple[str, ...]]] = []
    main_tool: dict[str, str] = {}
    closure: Counter = Counter()
    for i, obj in enumerate(_records(path)):
        require_fields(obj, {"user_query": str, "main_golden_function_name": str, "golden_function_names": list},
                       path, what=f"record {i}")
        main, golden = obj["main_golden_function_name"], obj["golden_function_names"]
        if filt.reject(obj["user_query"], [main, *golden], tools):
            continue
        if main not in golden:
            closure["main tool absent from golden_function_names (prepended)"] += 1
        gold = tuple(dict.fromkeys([main, *filt.gold(golden)]))
        full = _closure(main, needs)
        closure["gold == main + transitive dependencies" if set(gold) == full else
                "gold strictly inside the closure" if set(gold) < full else
                "gold outside the closure"] += 1
        kept.append((str(i), obj["user_query"], gold))
        main_tool[str(i)] = main
    return kept, main_tool, closure


@DATASETS.register("toollinkos")
def load_toollinkos(root: Path, test_fraction: float = 0.2, val_fraction: float = 0.1, seed: int = 0) -> ToolDataset:
    """ToolLinkOS: 573 tools with typed depends_on, 1,569 queries (main tool + prerequisites); seeded split."""
    if min(test_fraction, val_fraction) < 0 or test_fraction + val_fraction > 1:
        raise ConfigError(f"toollinkos: test_fraction={test_fraction} and val_fraction={val_fraction} must be >= 0 "
                          "and sum to <= 1")
    folder = root / "toollinkos" / "toollinkos"
    skipped: Counter = Counter()
    tools, raw_deps = _read_catalog(folder, skipped)
    edges, needs = _edges(tools, raw_deps, skipped)
    kept, main_tool, closure = _instances(folder / "instances.json", tools, needs, skipped)

    part = seeded_assign([q[0] for q in kept], {"test": test_fraction, "val": val_fraction,
                                                 "train": 1 - test_fraction - val_fraction}, seed)
    queries = [Query(qid, text, gold, part[qid]) for qid, text, gold in kept]
    deps = [Dependency(s, t, k) for s, t, k in edges]
    notes = {"files": [str(folder / f) for f in ("core_tools.json", "regular_tools.json", "instances.json")],
             "test_fraction": test_fraction, "val_fraction": val_fraction, "seed": seed,
             "closure": dict(closure), "main_tool": main_tool}
    return ToolDataset("toollinkos", list(tools.values()), queries, [], deps, +skipped, notes)
