"""The canonical on-disk format: a folder of JSONL files, read and written with validation.

    tools.jsonl         {"id", "name", "description", "agent"?, "category"?, "parameters"?, "returns"?}
    agents.jsonl        {"id", "name", "description", "category"?}          (optional)
    queries.jsonl       {"id", "text", "tools": [ids], "split", "steps"?: [text]}
    dependencies.jsonl  {"source", "target", "kind"?}                       (optional)

Every error names the file and the line. Low-level readers for source formats (JSON, JSONL,
TSV) live here too so every adapter reports errors the same way.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from toolgraph.data.schema import SPLITS, Agent, Dependency, Query, Tool, ToolDataset
from toolgraph.errors import ConfigError, DataError

_TOOL_FIELDS = {"id": str, "name": str, "description": str}
_TOOL_OPTIONAL = {"agent", "category", "parameters", "returns"}
_QUERY_FIELDS = {"id": str, "text": str, "tools": list}
_AGENT_FIELDS = {"id": str, "name": str}
_DEP_FIELDS = {"source": str, "target": str}


# ---- low-level readers shared by adapters --------------------------------------------------
def iter_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """Yield (line number, object) for each non-blank line; bad JSON -> DataError(file:line)."""
    path = Path(path)
    if not path.is_file():
        raise DataError("file not found", path)
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"malformed JSON: {e.msg} (column {e.colno})", path, lineno) from None


def read_json(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise DataError("file not found", path)
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"malformed JSON: {e.msg} (column {e.colno})", path, e.lineno) from None


def read_object_counting_repeats(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON object in ``path``, keeping the *first* value of a key repeated inside any object
    (the json module keeps the last, silently), and how many repeats were dropped.
    Bad JSON -> DataError(file:line)."""
    if not path.is_file():
        raise DataError("file not found", path)
    repeats = 0

    def first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal repeats
        out: dict[str, Any] = {}
        for key, value in pairs:
            out.setdefault(key, value)
        repeats += len(pairs) - len(out)
        return out

    try:
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=first_wins)
    except json.JSONDecodeError as e:
        raise DataError(f"malformed JSON: {e.msg} (column {e.colno})", path, e.lineno) from None
    if not isinstance(data, dict):
        raise DataError(f"expected a JSON object (name -> record), got {type(data).__name__}", path)
    return data, repeats


def read_tsv(path: str | Path, header: bool = True, quoted: bool = False) -> Iterator[tuple[int, list[str]]]:
    """Yield (line number where the row starts, fields). With ``header`` the first row is skipped.

    ``quoted``: pandas-style TSV, where quoted fields may hold quotes, tabs and newlines (ToolBench's
    corpus.tsv); otherwise quotes are ordinary characters (BEIR qrels)."""
    path = Path(path)
    if not path.is_file():
        raise DataError("file not found", path)
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_MINIMAL if quoted else csv.QUOTE_NONE)
        start, first = 1, True
        try:
            for row in reader:
                if row and not (header and first):
                    yield start, row
                first = False
                start = reader.line_num + 1
        except csv.Error as e:
            raise DataError(f"malformed TSV: {e}", path, reader.line_num) from None


def require_fields(obj: Any, fields: dict[str, type], path: str | Path, line: int | None = None,
                   what: str = "") -> None:
    """DataError naming file, line (or ``what``: "record 17") unless ``obj`` is a JSON object
    holding every field with the given type."""
    prefix = f"{what}: " if what else ""
    if not isinstance(obj, dict):
        raise DataError(f"{prefix}expected a JSON object, got {type(obj).__name__}", path, line)
    for key, typ in fields.items():
        if key not in obj:
            raise DataError(f"{prefix}missing field {key!r}", path, line)
        if not isinstance(obj[key], typ):
            raise DataError(f"{prefix}field {key!r} must be {typ.__name__}, got {type(obj[key]).__name__}", path, line)


def _require(obj: Any, fields: dict[str, type], path: Path, lineno: int) -> None:
    require_fields(obj, fields, path, lineno)
    for key, typ in fields.items():
        if typ is str and key in ("id", "text", "name", "source", "target") and not obj[key].strip():
            raise DataError(f"field {key!r} is empty", path, lineno)


# ---- canonical folder ------------------------------------------------------------------------
def read_dataset(folder: str | Path, name: str | None = None) -> ToolDataset:
    """Read a canonical folder. Checks everything ToolDataset.validate checks, with file:line."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError("dataset folder not found", folder)
    tools: list[Tool] = []
    tool_line: dict[str, int] = {}
    tools_path = folder / "tools.jsonl"
    for lineno, obj in iter_jsonl(tools_path):
        _require(obj, _TOOL_FIELDS, tools_path, lineno)
        unknown = set(obj) - set(_TOOL_FIELDS) - _TOOL_OPTIONAL
        if unknown:
            raise DataError(f"unknown field(s) {sorted(unknown)}", tools_path, lineno)
        if obj["id"] in tool_line:
            raise DataError(f"duplicate tool id {obj['id']!r} (first on line {tool_line[obj['id']]})", tools_path, lineno)
        tool_line[obj["id"]] = lineno
        tools.append(Tool(**obj))

    agents: list[Agent] = []
    agents_path = folder / "agents.jsonl"
    if agents_path.exists():
        seen: dict[str, int] = {}
        for lineno, obj in iter_jsonl(agents_path):
            _require(obj, _AGENT_FIELDS, agents_path, lineno)
            if obj["id"] in seen:
                raise DataError(f"duplicate agent id {obj['id']!r} (first on line {seen[obj['id']]})", agents_path, lineno)
            seen[obj["id"]] = lineno
            agents.append(Agent(obj["id"], obj["name"], obj.get("description", ""), obj.get("category")))
        for t in tools:
            if t.agent is not None and t.agent not in seen:
                raise DataError(f"tool {t.id!r} names unknown agent {t.agent!r}", tools_path, tool_line[t.id])

    queries: list[Query] = []
    queries_path = folder / "queries.jsonl"
    qseen: dict[str, int] = {}
    for lineno, obj in iter_jsonl(queries_path):
        _require(obj, _QUERY_FIELDS, queries_path, lineno)
        if obj["id"] in qseen:
            raise DataError(f"duplicate query id {obj['id']!r} (first on line {qseen[obj['id']]})", queries_path, lineno)
        qseen[obj["id"]] = lineno
        split = obj.get("split", "test")
        if split not in SPLITS:
            raise DataError(f"split {split!r} not in {SPLITS}", queries_path, lineno)
        if not obj["tools"]:
            raise DataError("query has no gold tools", queries_path, lineno)
        for tid in obj["tools"]:
            if tid not in tool_line:
                raise DataError(f"query names unknown tool {tid!r}", queries_path, lineno)
        steps = obj.get("steps")
        queries.append(Query(obj["id"], obj["text"], tuple(obj["tools"]), split, tuple(steps) if steps else None))

    deps: list[Dependency] = []
    deps_path = folder / "dependencies.jsonl"
    if deps_path.exists():
        for lineno, obj in iter_jsonl(deps_path):
            _require(obj, _DEP_FIELDS, deps_path, lineno)
            for end in ("source", "target"):
                if obj[end] not in tool_line:
                    raise DataError(f"dependency names unknown tool {obj[end]!r}", deps_path, lineno)
            deps.append(Dependency(obj["source"], obj["target"], obj.get("kind")))

    skipped: Counter = Counter()
    meta_path = folder / "meta.json"
    if meta_path.exists():
        skipped.update(read_json(meta_path).get("skipped", {}))
    return ToolDataset(name or folder.name, tools, queries, agents, deps, skipped, {"folder": str(folder)})


def write_dataset(ds: ToolDataset, folder: str | Path) -> Path:
    """Write the canonical folder (plus meta.json with the stats and skip counts)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    def dump(path: Path, rows: list[dict]) -> None:
        with path.open("w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")

    dump(folder / "tools.jsonl", [_drop_none(vars(t)) for t in ds.tools])
    dump(folder / "queries.jsonl", [_drop_none({**vars(q), "tools": list(q.tools),
                                               "steps": list(q.steps) if q.steps else None}) for q in ds.queries])
    if ds.agents:
        dump(folder / "agents.jsonl", [_drop_none(vars(a)) for a in ds.agents])
    if ds.dependencies:
        dump(folder / "dependencies.jsonl", [_drop_none(vars(d)) for d in ds.dependencies])
    (folder / "meta.json").write_text(json.dumps({**ds.stats(), "notes": ds.notes}, indent=2, default=str) + "\n")
    return folder


def _drop_none(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


def read_edges(path: str | Path, threshold: float = 0.5, max_per_source: int | None = None) -> list[tuple[str, str]]:
    """(source, target) of a dependency edge file (``toolgraph graph build`` writes it: one
    ``{"source", "target", "prob"?}`` per line; a folder means its edges.jsonl) with prob >= threshold;
    ``max_per_source``: only each source's most probable targets (ties: file order)."""
    p = Path(path)
    if p.is_dir():
        p = p / "edges.jsonl"
    if not p.is_file():
        raise ConfigError(f"retriever.graph: {str(path)!r} is neither 'gold' nor an edges.jsonl (toolgraph graph build)")
    kept = []
    for lineno, row in iter_jsonl(p):
        if not isinstance(row, dict) or not isinstance(row.get("source"), str) or not isinstance(row.get("target"), str):
            raise DataError("expected {\"source\": str, \"target\": str, \"prob\"?: number}", p, lineno)
        prob = float(row.get("prob", 1.0))
        if prob >= threshold:
            kept.append((row["source"], row["target"], prob))
    if max_per_source is not None:
        if max_per_source < 1:
            raise ConfigError(f"retriever.max_prerequisites must be >= 1 or null, got {max_per_source}")
        ranked = sorted(range(len(kept)), key=lambda i: -kept[i][2])  # stable: file order among ties
        count: dict[str, int] = {}
        chosen = set()
        for i in ranked:
            source = kept[i][0]
            if count.get(source, 0) < max_per_source:
                count[source] = count.get(source, 0) + 1
                chosen.add(i)
        kept = [e for i, e in enumerate(kept) if i in chosen]
    return [(s, t) for s, t, _ in kept]
