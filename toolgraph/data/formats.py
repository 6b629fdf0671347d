"""The canonical on-disk format: a folder of JSONL files, read and written with validation.

    tools.jsonl         {"id", "name", "description", "agent"?, "category"?, "parameters"?, "returns"?}
    agents.jsonl        {"id", "name", "description", "category"?}          (optional)
    queries.jsonl       {"id", "text", "tools": [ids], "split", "steps"?: [text]}
    dependencies.jsonl  {"source", "target", "kind"?}                       (optional)

Every error names the file and the line. Low-level readers for source formats (JSON, JSONL,
TSV) live here too so every adapter reports errors the same way: malformed JSON, JSON nested too
deeply and bytes that are not UTF-8 (named by byte offset) are DataErrors, never raw tracebacks.

Gold tool ids repeated inside one query are kept once (``Query`` does it; the reader counts them in
``notes["repeated_gold_ids"]``), so training and evaluation count a query's gold set the same way. A
repeated query id is a DataError naming both lines unless the reader is given ``on_duplicate``
(``keep-first`` / ``keep-last``: the repeat is counted in ``skipped``).
"""

from __future__ import annotations

import csv
import gc
import json
from collections import Counter
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from toolgraph.data.schema import SPLITS, Agent, Dependency, Query, Tool, ToolDataset
from toolgraph.errors import ConfigError, DataError

_TOOL_FIELDS = {"id": str, "name": str, "description": str}
_TOOL_OPTIONAL = {"agent", "category", "parameters", "returns"}
_QUERY_FIELDS = {"id": str, "text": str, "tools": list}
_AGENT_FIELDS = {"id": str, "name": str}
_DEP_FIELDS = {"source": str, "target": str}
ON_DUPLICATE = ("error", "keep-first", "keep-last")  # what a reader does with an id met twice


# ---- low-level readers shared by adapters --------------------------------------------------
def _not_utf8(path: Path) -> DataError:
    """The DataError for a file that is not UTF-8: the first bad byte's offset and its line."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        return DataError(f"not valid UTF-8 at byte offset {e.start} (byte 0x{data[e.start]:02x}: {e.reason}); "
                         "re-save the file as UTF-8", path, line)
    return DataError("not valid UTF-8; re-save the file as UTF-8", path)


@contextmanager
def utf8_errors(path: str | Path) -> Iterator[None]:
    """Turn a UnicodeDecodeError met while reading ``path`` into a DataError naming the byte offset."""
    try:
        yield
    except UnicodeDecodeError:
        raise _not_utf8(Path(path)) from None


def read_text(path: str | Path) -> str:
    """The whole file as text; missing file or bytes that are not UTF-8 -> DataError."""
    path = Path(path)
    if not path.is_file():
        raise DataError("file not found", path)
    with utf8_errors(path):
        return path.read_text(encoding="utf-8")


def parse_json(text: str, path: str | Path, line: int | None = None, **kw: Any) -> Any:
    """``json.loads`` with every failure a DataError naming ``path`` (and ``line``, for one JSONL
    line): malformed JSON, nesting too deep for the parser, a number too long to convert."""
    try:
        return json.loads(text, **kw)
    except json.JSONDecodeError as e:
        raise DataError(f"malformed JSON: {e.msg} (column {e.colno})", path,
                        line if line is not None else e.lineno) from None
    except RecursionError:
        raise DataError("JSON nested too deeply to read", path, line) from None
    except ValueError as e:  # e.g. an integer literal longer than Python converts
        raise DataError(f"unreadable JSON value: {e}", path, line) from None


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """Yield (line number, object) for each non-blank line; bad JSON or bad UTF-8 -> DataError(file:line)."""
    path = Path(path)
    if not path.is_file():
        raise DataError("file not found", path)
    with utf8_errors(path), path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            yield lineno, parse_json(line, path, lineno)


BIG_FILE_RECORDS = 100_000  # from this many records a reader moves them out of the collector's view


class gc_paused:  # noqa: N801 - used as a context manager, like contextlib's
    """Python's cyclic garbage collector off while a big file becomes millions of objects: each full
    collection walks every object made so far, so reading a 1M-tool file ran ever longer collections
    (17.5 s instead of 11, and a server loading it stalled its requests for up to 1.7 s at a time).
    Records hold no reference cycles; reference counting frees them as before. ``freeze(n)`` before
    the block ends: when ``n`` records were made (``BIG_FILE_RECORDS`` or more), every object is moved
    to the permanent generation (``gc.freeze``) so that the first collection after the block (and every
    later full one) does not walk them either: a 1.6 s stall otherwise."""

    def __init__(self) -> None:
        self._freeze = False

    def freeze(self, records: int) -> None:
        self._freeze = records >= BIG_FILE_RECORDS

    def __enter__(self) -> gc_paused:
        self._was = gc.isenabled()
        gc.disable()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._freeze and exc[0] is None:
            gc.freeze()
        if self._was:
            gc.enable()


def read_json(path: str | Path) -> Any:
    path = Path(path)
    return parse_json(read_text(path), path)


def read_object_counting_repeats(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON object in ``path``, keeping the *first* value of a key repeated inside any object
    (the json module keeps the last, silently), and how many repeats were dropped.
    Bad JSON -> DataError(file:line)."""
    repeats = 0

    def first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal repeats
        out: dict[str, Any] = {}
        for key, value in pairs:
            out.setdefault(key, value)
        repeats += len(pairs) - len(out)
        return out

    data = parse_json(read_text(path), path, object_pairs_hook=first_wins)
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
    with utf8_errors(path), path.open(encoding="utf-8", newline="") as f:
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


def _require(obj: Any, fields: dict[str, type], path: Path, lineno: int,
             optional: dict[str, type | tuple[type, ...]] | None = None) -> None:
    """``require_fields``, then: the id-like strings not blank, ``optional`` fields (when present and not
    null) of their type, and no string a UTF-8 file could not hold (a lone surrogate escape)."""
    require_fields(obj, fields, path, lineno)
    for key, typ in fields.items():
        if typ is str and key in ("id", "text", "name", "source", "target") and not obj[key].strip():
            raise DataError(f"field {key!r} is empty", path, lineno)
    for key, typ in (optional or {}).items():
        if obj.get(key) is not None and not isinstance(obj[key], typ):
            names = " or ".join(t.__name__ for t in (typ if isinstance(typ, tuple) else (typ,)))
            raise DataError(f"field {key!r} must be {names} (or left out), got {type(obj[key]).__name__}", path, lineno)
    for key, value in obj.items():
        if isinstance(value, str) and not _encodable(value):
            raise DataError(f"field {key!r} holds a lone surrogate (\\ud800-\\udfff) that UTF-8 cannot encode",
                            path, lineno)


def _encodable(text: str) -> bool:
    if text.isascii():  # O(1) in CPython, and a lone surrogate is never ASCII: most strings stop here
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _string_list(obj: dict, key: str, path: Path, lineno: int, what: str) -> list[str]:
    """``obj[key]`` as a list of non-empty strings (a plain string is refused, not split into characters)."""
    value = obj[key]
    if not isinstance(value, list):
        raise DataError(f"field {key!r} must be a list of {what}, got {type(value).__name__}", path, lineno)
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip() or not _encodable(item):
            raise DataError(f"field {key!r}[{i}] must be a non-empty string ({what}), got {item!r:.60}", path, lineno)
    return value


class Duplicates:
    """Where each id was first met, and what a repeat does under the ``on_duplicate`` policy:
    ``error`` raises a DataError naming both places; ``keep-first`` / ``keep-last`` count the repeat in
    ``skipped`` (``"repeated <what> (first kept)"`` / ``"(last kept)"``) and tell the caller which copy
    to keep. Readers of ids that must be unique share it (canonical queries, BEIR, MCP servers)."""

    def __init__(self, what: str, policy: str, skipped: Counter, key: str = "data.options.on_duplicate") -> None:
        if policy not in ON_DUPLICATE:
            raise ConfigError(f"{key}: {policy!r} is not one of {', '.join(ON_DUPLICATE)}")
        self.what, self.policy, self.skipped, self.key = what, policy, skipped, key
        self.first: dict[Hashable, str] = {}

    def add(self, ident: Hashable, path: str | Path | None, where: int | str | None = None) -> str:
        """``"new"`` for an id not met before; for a repeat ``"skip"`` (keep the first copy) or
        ``"replace"`` (keep this one). ``where``: a line number, or words ("task #3")."""
        if ident not in self.first:
            self.first[ident] = f"line {where}" if isinstance(where, int) else (where or "an earlier record")
            return "new"
        if self.policy == "error":
            line = where if isinstance(where, int) else None
            at = f"{where}: " if isinstance(where, str) else ""
            raise DataError(f"{at}duplicate {self.what} {ident!r} (first on {self.first[ident]}); fix the file, or "
                            "keep one copy with on_duplicate: keep-first or keep-last (data.options.on_duplicate; "
                            "toolgraph index sync --on-duplicate)", path, line)
        kept = "first" if self.policy == "keep-first" else "last"
        self.skipped[f"repeated {self.what} ({kept} kept)"] += 1
        return "skip" if kept == "first" else "replace"


# ---- canonical folder ------------------------------------------------------------------------
def read_dataset(folder: str | Path, name: str | None = None, on_duplicate: str = "error") -> ToolDataset:
    """Read a canonical folder. Checks everything ToolDataset.validate checks, with file:line.

    ``on_duplicate``: a query id met twice is an ``error`` (default), or ``keep-first`` / ``keep-last``
    (counted in ``skipped``). Gold ids repeated inside a query are kept once and counted in
    ``notes["repeated_gold_ids"]``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError("dataset folder not found", folder)
    skipped: Counter = Counter()
    repeats = Duplicates("query id", on_duplicate, skipped)  # the option is checked before any file is read
    tools, tool_line = _read_tools(folder / "tools.jsonl")
    agents = _read_agents(folder / "agents.jsonl", tools, tool_line, folder / "tools.jsonl")

    queries: dict[str, Query] = {}
    repeated_gold: dict[str, int] = {}  # query id -> gold ids named again in it
    queries_path = folder / "queries.jsonl"
    for lineno, obj in iter_jsonl(queries_path):
        _require(obj, _QUERY_FIELDS, queries_path, lineno, {"split": str, "steps": list})
        split = obj.get("split", "test")
        if split not in SPLITS:
            raise DataError(f"split {split!r} not in {SPLITS}", queries_path, lineno)
        gold = _string_list(obj, "tools", queries_path, lineno, "tool ids")
        if not gold:
            raise DataError("query has no gold tools", queries_path, lineno)
        for tid in gold:
            if tid not in tool_line:
                raise DataError(f"query names unknown tool {tid!r}", queries_path, lineno)
        steps = _string_list(obj, "steps", queries_path, lineno, "sub-task texts") if obj.get("steps") is not None else None
        if repeats.add(obj["id"], queries_path, lineno) == "skip":
            continue
        repeated_gold[obj["id"]] = len(gold) - len(set(gold))
        queries[obj["id"]] = Query(obj["id"], obj["text"], tuple(gold), split, tuple(steps) if steps else None)

    deps: list[Dependency] = []
    deps_path = folder / "dependencies.jsonl"
    if deps_path.exists():
        for lineno, obj in iter_jsonl(deps_path):
            _require(obj, _DEP_FIELDS, deps_path, lineno, {"kind": str})
            for end in ("source", "target"):
                if obj[end] not in tool_line:
                    raise DataError(f"dependency names unknown tool {obj[end]!r}", deps_path, lineno)
            deps.append(Dependency(obj["source"], obj["target"], obj.get("kind")))

    meta_path = folder / "meta.json"
    if meta_path.exists():
        skipped.update(meta_skipped(meta_path))
    return ToolDataset(name or folder.name, tools, list(queries.values()), agents, deps, skipped,
                       {"folder": str(folder), "repeated_gold_ids": sum(repeated_gold.values())})


def _read_tools(path: Path) -> tuple[list[Tool], dict[str, int]]:
    tools: list[Tool] = []
    tool_line: dict[str, int] = {}
    with gc_paused() as paused:
        for lineno, obj in iter_jsonl(path):
            tool = tool_record(obj, path, lineno)
            if tool.id in tool_line:
                raise DataError(f"duplicate tool id {tool.id!r} (first on line {tool_line[tool.id]})", path, lineno)
            tool_line[tool.id] = lineno
            tools.append(tool)
        paused.freeze(len(tools))
    return tools, tool_line


def tool_record(obj: Any, path: Path, lineno: int) -> Tool:
    """One parsed line of a dataset's ``tools.jsonl`` as a Tool; a bad record is a DataError(file:line)."""
    _require(obj, _TOOL_FIELDS, path, lineno, {"agent": str, "category": str})
    unknown = set(obj) - set(_TOOL_FIELDS) - _TOOL_OPTIONAL
    if unknown:
        raise DataError(f"unknown field(s) {sorted(unknown)}", path, lineno)
    return Tool(**obj)


def _read_agents(path: Path, tools: list[Tool], tool_line: dict[str, int], tools_path: Path) -> list[Agent]:
    if not path.exists():
        return []
    agents: list[Agent] = []
    seen: dict[str, int] = {}
    for lineno, obj in iter_jsonl(path):
        _require(obj, _AGENT_FIELDS, path, lineno, {"description": str, "category": str})
        if obj["id"] in seen:
            raise DataError(f"duplicate agent id {obj['id']!r} (first on line {seen[obj['id']]})", path, lineno)
        seen[obj["id"]] = lineno
        agents.append(Agent(obj["id"], obj["name"], obj.get("description") or "", obj.get("category")))
    for t in tools:
        if t.agent is not None and t.agent not in seen:
            raise DataError(f"tool {t.id!r} names unknown agent {t.agent!r}", tools_path, tool_line[t.id])
    return agents


def meta_skipped(path: Path) -> dict[str, int]:
    """meta.json's ``skipped`` counts ({reason: count}); anything else there is ignored."""
    meta = read_json(path)
    skipped = meta.get("skipped", {}) if isinstance(meta, dict) else None
    if not isinstance(skipped, dict) or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                                for k, v in skipped.items()):
        raise DataError("expected a JSON object whose 'skipped' maps reasons to counts", path)
    return skipped


def write_dataset(ds: ToolDataset, folder: str | Path) -> Path:
    """Write the canonical folder (plus meta.json with the stats and skip counts)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    def dump(path: Path, rows: list[dict]) -> None:
        with path.open("w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")

    dump(folder / "tools.jsonl", [t.to_dict() for t in ds.tools])
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


def read_edges(path: str | Path, threshold: float | None = None, max_per_source: int | None = None) -> list[tuple[str, str]]:
    """(source, target) of a dependency edge file (``toolgraph graph build`` writes it: an optional
    first line ``{"header": {...}}`` describing the graph, then one ``{"source", "target", "prob"?}``
    per line; a folder means its edges.jsonl) with prob >= threshold (None: the header's
    ``edge_threshold``, chosen on the discriminator's val pairs, else 0.5); ``max_per_source``: only
    each source's most probable targets (ties: file order)."""
    p = Path(path)
    if p.is_dir():
        p = p / "edges.jsonl"
    if not p.is_file():
        raise ConfigError(f"retriever.graph: {str(path)!r} is neither 'gold' nor an edges.jsonl (toolgraph graph build)")
    if threshold is None:
        threshold = float(read_graph_header(p).get("edge_threshold", 0.5))
    kept = []
    for lineno, row in iter_jsonl(p):
        if lineno == 1 and isinstance(row, dict) and "header" in row:
            continue
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


def read_graph_header(path: str | Path) -> dict:
    """The ``{"header": {...}}`` first line of an edges.jsonl (or its folder), or {} if it has none."""
    p = Path(path)
    p = p / "edges.jsonl" if p.is_dir() else p
    with p.open(encoding="utf-8") as f:
        first = f.readline()
    try:
        row = json.loads(first) if first.strip() else {}
    except json.JSONDecodeError:
        raise DataError("not a JSON line", p, 1) from None
    header = row.get("header") if isinstance(row, dict) else None
    if header is not None and not isinstance(header, dict):
        raise DataError("'header' must be an object", p, 1)
    return header or {}
