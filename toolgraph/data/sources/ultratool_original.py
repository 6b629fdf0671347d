"""UltraTool, original release (Huang et al., "Planning, Creation, Usage: Benchmarking LLMs for Comprehensive
Tool Utilization in Real-World Complex Scenarios", Findings of ACL 2024; github.com/JoeYing1019/UltraTool).

Test only: ``data/English-dataset/test.json`` (``ultratool-original``) or ``data/Chinese-dataset/test.json``
(``ultratool-original-zh``), JSONL, 1,000 records each, no ids (a query's id is its 0-based record index, the
same order as the ``test_set/*.json`` task files). ``dev.json`` is not in the snapshot.

A record is ``{"question", "plan": [{"step", "tool"}], "tools": [tool definitions], "domain"}``. A plan step's
``tool`` is either a no-tool marker (``"null"`` for a parent step, ``"No tool required"`` / ``"不需要工具"``) or a
call string ``name(arg=..., ...)``; exactly one call per step, never nested. The record's ``tools`` list defines
exactly the tools its plan calls (checked: same set, same first-call order, in all 2,000 records).

Labels: the tools the plan calls, in call order, each once. Steps: the text of each calling step (one per call,
repeats included, the ``1.2`` numbering stripped); they describe the sub-task, and only 6 of 2,381 English ones
name the tool. Dependencies: consecutive calls in the plan, ``Dependency(later, earlier, "sequence")``,
deduplicated, like GNN4TaskPlan's chain ``task_links`` (for the 639 requests both hold, the reformat's nodes
equal these calls in 530; the rest differ by its tool renaming); a tool called twice in a row gives no self-edge
(counted in ``skipped``). ``dependency_splits=[]`` turns them off (they are test labels).

Catalog: the union of the records' definitions, deduplicated by name (2,132 definitions -> 436 tools; a name
redefined with another description or schema keeps the first and counts the conflict in ``skipped``; there are
none in this release). ``parameters`` = the definition's ``arguments`` JSON schema, ``returns`` = its ``results``.
UltraTool has no owner level, so no agents; ``category`` = the domains of the records using the tool, in order
of first use, joined by ", " (49 English tools serve more than one domain).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from toolgraph.data.formats import iter_jsonl, require_fields
from toolgraph.data.schema import Dependency, Query, Tool, ToolDataset
from toolgraph.data.sources._filter import QueryFilter, SkipReasons
from toolgraph.data.sources.seal_tools import check_dependency_splits
from toolgraph.errors import DataError
from toolgraph.registry import DATASETS

_CALL = re.compile(r"^\s*([A-Za-z_]\w*)\s*\(")
_NO_TOOL = {"", "null", "none", "no tool required", "不需要工具"}
_STEP_NUMBER = re.compile(r"^\s*\d+(?:\.\d+)*\.?\s*")
LANG_PATHS = {"en": "ultratool/data/English-dataset/test.json", "zh": "ultratool/data/Chinese-dataset/test.json"}
_REASONS = SkipReasons(empty_text="query with empty text", no_tools="query whose plan calls no tool",
                       unknown_tool="query calling a tool no record defines",
                       repeated_tool="repeated call of a tool already in the query's gold list")


@dataclass(frozen=True)
class Record:
    index: int  # 0-based record index
    lineno: int
    question: str
    calls: tuple[tuple[str, str], ...]  # (tool name, step text) per calling step, in plan order
    domain: str | None
    n_defs: int  # tool definitions in the record


def normalize_text(text: str) -> str:
    """Whitespace-insensitive form used to match a request across UltraTool releases."""
    return " ".join(text.split())


def read_original(path: Path, skipped: Counter) -> tuple[list[Record], dict[str, dict], dict[str, list[str]]]:
    """Parse an UltraTool ``test.json``: the records, the tool definitions by name (first kept) and, by name,
    the domains of the records defining the tool. Unparsable tool fields are counted in ``skipped``."""
    records: list[Record] = []
    defs: dict[str, dict] = {}
    domains: dict[str, list[str]] = {}
    for lineno, obj in iter_jsonl(path):
        require_fields(obj, {"question": str, "plan": list, "tools": list}, path, lineno, "record")
        domain = obj.get("domain") or None
        for tool in obj["tools"]:
            require_fields(tool, {"name": str, "description": str}, path, lineno, "tool definition")
            name = tool["name"].strip()
            if not name:
                raise DataError("tool definition: empty 'name'", path, lineno)
            if name not in defs:
                defs[name] = tool
            elif defs[name]["description"] != tool["description"]:
                skipped["tool redefined with another description (first kept)"] += 1
            elif any(defs[name].get(k) != tool.get(k) for k in ("arguments", "results")):
                skipped["tool redefined with another schema (first kept)"] += 1
            if domain and domain not in domains.setdefault(name, []):
                domains[name].append(domain)
        calls: list[tuple[str, str]] = []
        for step in obj["plan"]:
            require_fields(step, {"step": str, "tool": str}, path, lineno, "plan step")
            m = _CALL.match(step["tool"])
            if m:
                calls.append((m.group(1), _STEP_NUMBER.sub("", step["step"]).strip()))
            elif step["tool"].strip().lower() not in _NO_TOOL:
                skipped["plan step whose tool field is neither a call nor a no-tool marker (step ignored)"] += 1
        records.append(Record(len(records), lineno, obj["question"].strip(), tuple(calls), domain, len(obj["tools"])))
    return records, defs, domains


def sequence_edges(names: Sequence[str], edges: Counter, skipped: Counter) -> None:
    """Count ``(later, earlier)`` for each consecutive pair of calls in ``edges`` (support: once per query)."""
    pairs: dict[tuple[str, str], None] = {}
    for earlier, later in zip(names, names[1:]):
        if earlier == later:
            skipped["tool called twice in a row (no self-edge)"] += 1
        else:
            pairs[(later, earlier)] = None
    edges.update(list(pairs))


def load_original(root: Path, lang: str, dependency_splits: Sequence[str] | None) -> ToolDataset:
    name = "ultratool-original" + ("" if lang == "en" else f"-{lang}")
    dep_splits = check_dependency_splits(dependency_splits, name)
    path = root / LANG_PATHS[lang]
    skipped: Counter = Counter()
    records, defs, domains = read_original(path, skipped)
    tools = [Tool(n, n, d["description"], category=", ".join(domains.get(n, [])) or None,
                  parameters=d.get("arguments"), returns=d.get("results")) for n, d in defs.items()]
    filt = QueryFilter(_REASONS, skipped)
    queries: list[Query] = []
    edges: Counter = Counter()
    for rec in records:
        names = [c[0] for c in rec.calls]
        if filt.reject(rec.question, names, defs):
            continue
        queries.append(Query(str(rec.index), rec.question, filt.gold(names), "test", tuple(c[1] for c in rec.calls)))
        if "test" in dep_splits:
            sequence_edges(names, edges, skipped)
    deps = [Dependency(s, t, "sequence") for s, t in edges]
    notes = {"files": [str(path)], "lang": lang, "dependency_splits": sorted(dep_splits),
             "tool_definitions": sum(r.n_defs for r in records),
             "dependency_support": [[s, t, c] for (s, t), c in edges.items()]}  # [source, target, #queries]
    return ToolDataset(name, tools, queries, [], deps, +skipped, notes)


@DATASETS.register("ultratool-original")
def load_ultratool_original(root: Path, dependency_splits: Sequence[str] | None = None) -> ToolDataset:
    """Original English UltraTool test (1,000 queries, 436 tools). ``dependency_splits``: splits whose plans
    yield dependency edges (default all; pass [] for none, since these are test labels)."""
    return load_original(root, "en", dependency_splits)


@DATASETS.register("ultratool-original-zh")
def load_ultratool_original_zh(root: Path, dependency_splits: Sequence[str] | None = None) -> ToolDataset:
    """Original Chinese UltraTool test (same plans and tool names as the English one, Chinese text)."""
    return load_original(root, "zh", dependency_splits)
