"""An agent's usage log: one JSON line per request, the tools the agent called for it.

    {"query": "book a table for two tonight", "tools": ["opentable.search", "opentable.book"], "ok": true,
     "time": "2026-11-30T18:02:11Z"}

``query`` (the user's request, a non-empty string) and ``tools`` (the ids of the tools called, a
non-empty list of catalog ids) are required. ``ok`` (did the task succeed; default true) and ``time``
(ISO 8601, or Unix seconds; default: when the log is read) are optional. The stored queries are user
text: ``toolgraph index feedback --remove`` deletes them by text or by time.

``read_log`` checks every line first and returns the entries only if all are good (all or nothing):
a bad line is a DataError naming the file and line. ``dedupe`` keeps one entry per (query, tool set):
a request repeated a thousand times counts once, with its latest time and outcome. ``log_dataset``
turns entries into a ToolDataset (train and a carved val), which is how a log trains a model.
"""

from __future__ import annotations

import math
import time as _time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from toolgraph.data.formats import iter_jsonl
from toolgraph.data.schema import Agent, Query, Tool, ToolDataset
from toolgraph.data.splits import carve_val
from toolgraph.errors import DataError

FIELDS = ("query", "tools", "ok", "time")
MAX_QUERY_CHARS = 8_000  # a request longer than this is not a user's query (and is stored as user text)


@dataclass(frozen=True)
class Entry:
    query: str
    tools: tuple[str, ...]  # catalog ids, once each, in call order
    ok: bool = True
    time: float = 0.0  # Unix seconds

    @property
    def key(self) -> tuple[str, frozenset[str]]:
        return normalise(self.query), frozenset(self.tools)

    def to_dict(self) -> dict[str, Any]:
        return {"query": self.query, "tools": list(self.tools), "ok": self.ok, "time": self.time}


def normalise(query: str) -> str:
    """The form two requests are compared in (dedupe, ``--remove --query``): case and spacing ignored."""
    return " ".join(query.split()).casefold()


def parse_time(value: Any, where: str = "time") -> float:
    """Unix seconds from a number (or a numeric string) or an ISO 8601 string (a time without a zone is UTC); a ValueError
    saying what is expected otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{where} must be ISO 8601 (2026-11-30T18:02:11Z) or Unix seconds, got {value!r}")
    if isinstance(value, str):
        try:
            value = float(value)  # "1764525731" (a command line's --before) is Unix seconds too
        except ValueError:
            pass
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{where} must be Unix seconds >= 0, got {value!r}")
        return float(value)
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{where} must be ISO 8601 (2026-11-30T18:02:11Z) or Unix seconds, got {value!r}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


def read_log(path: str | Path, known: set[str] | None = None, now: float | None = None) -> list[Entry]:
    """Every line of ``path`` as an Entry, in file order; ``known``: the catalog's tool ids (an unknown
    id is a DataError naming file and line). Nothing is returned unless every line is good."""
    path = Path(path)
    now = _time.time() if now is None else now
    entries = [parse_entry(obj, path, lineno, known, now) for lineno, obj in iter_jsonl(path)]
    if not entries:
        raise DataError('the log has no lines; expected one JSON object per line: {"query": ..., "tools": [...]}',
                        path)
    return entries


def parse_entry(obj: Any, path: Path, lineno: int, known: set[str] | None, now: float) -> Entry:
    def bad(message: str) -> DataError:
        return DataError(f"{message}; nothing was applied", path, lineno)

    if not isinstance(obj, dict):
        raise bad(f'expected an object {{"query": ..., "tools": [...]}}, got {type(obj).__name__}')
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise bad(f"unknown key(s) {unknown}: a line has {', '.join(FIELDS)}")
    query = obj.get("query")
    if not isinstance(query, str) or not query.strip():
        raise bad("'query' must be a non-empty string (the user's request)")
    if len(query) > MAX_QUERY_CHARS:
        raise bad(f"'query' is {len(query):,} characters (at most {MAX_QUERY_CHARS:,})")
    tools = obj.get("tools")
    if not isinstance(tools, list) or not all(isinstance(t, str) and t for t in tools):
        raise bad("'tools' must be a list of tool ids (strings)")
    if not tools:
        raise bad("'tools' is empty: a request with no tool calls teaches the index nothing; leave it out")
    if known is not None:
        missing = [t for t in tools if t not in known]
        if missing:
            raise bad(f"tool id(s) {missing[:5]} are not in the index's catalog; sync the catalog first "
                      "(toolgraph index sync) or drop the line")
    ok = obj.get("ok", True)
    if not isinstance(ok, bool):
        raise bad(f"'ok' must be true or false, got {ok!r}")
    try:
        when = parse_time(obj["time"], "'time'") if obj.get("time") is not None else now
    except ValueError as e:
        raise bad(str(e)) from None
    return Entry(query.strip(), tuple(dict.fromkeys(tools)), ok, when)


def dedupe(entries: Iterable[Entry]) -> list[Entry]:
    """One entry per (query, tool set), the latest by time (file order breaks ties); in time order."""
    latest: dict[tuple[str, frozenset[str]], Entry] = {}
    for e in entries:
        old = latest.get(e.key)
        if old is None or e.time >= old.time:
            latest[e.key] = e
    return sorted(latest.values(), key=lambda e: e.time)


def merge(stored: Sequence[Entry], new: Sequence[Entry], cap: int | None = None) -> tuple[list[Entry], int]:
    """The stored entries with ``new`` added (deduped), then the oldest dropped beyond ``cap``; the
    merged list and how many the cap dropped."""
    merged = dedupe([*stored, *new])
    dropped = max(0, len(merged) - cap) if cap is not None else 0
    return merged[dropped:], dropped


def remove(stored: Sequence[Entry], queries: Iterable[str] = (), before: float | None = None) -> list[Entry]:
    """The entries kept after removing those whose query is one of ``queries`` (compared by
    :func:`normalise`) or whose time is before ``before``."""
    drop = {normalise(q) for q in queries}
    return [e for e in stored if normalise(e.query) not in drop and (before is None or e.time >= before)]


def log_dataset(tools: Sequence[Tool], entries: Sequence[Entry], agents: Sequence[Agent] = (),
                val_fraction: float = 0.1, seed: int = 0, name: str = "usage-log",
                extra: Sequence[Query] = ()) -> ToolDataset:
    """The successful entries as training queries over ``tools`` (a seeded ``val_fraction`` carved as
    val; failed ones left out), plus ``extra`` queries (a benchmark's test split) as they are."""
    ids = {t.id for t in tools}
    queries = [Query(f"log-{i}", e.query, tuple(t for t in e.tools if t in ids), "train")
               for i, e in enumerate(entries) if e.ok and any(t in ids for t in e.tools)]
    queries = carve_val(queries, val_fraction, seed) if len(queries) >= 10 else queries
    return ToolDataset(name, list(tools), queries + [replace(q) for q in extra], list(agents))
