"""``index sync``'s fast path: a big dense index changed by what changed in its catalog, nothing more.

A full sync parses every tool of the catalog and of the index and saves the whole index again; at a
million tools that is minutes of JSON and hashing, however few tools changed. So when a plain
``dense`` index is synced from a dataset folder (``tools.jsonl``), the sync also writes
``sync-state.json`` into the index (listed in its manifest, so it describes exactly that index): for
each catalog line, a digest of its bytes, the tool's id and agent, and a digest of the tool's fields.

The next sync of a dataset folder into that index reads the catalog's bytes and digests each line;
only lines it has not seen are parsed (and checked as a full read checks them). A tool whose line
changed but whose fields did not (keys reordered) is unchanged. Tools added or changed are encoded;
the new index is the old one's files hard-linked as they are, plus a delta (retrieval/delta.py) that
the old delta and this sync's changes make together, and a new state. The counts are the full
sync's, plus ``delta`` (the tools and removals the index carries over its base).

Anything else takes the full sync (``plan`` returns None), which also compacts (writes one base):
another retriever (a feedback, t2a or tgr index, ...), a catalog that is not a dataset folder or has
queries or dependencies, a catalog line the fast read cannot place (a duplicate, a bad record: the
full sync reports it with its file and line), another agents.jsonl or ``max_text_chars`` than the
state's, a delta past ``COMPACT_AT`` of the base, an ANN index the delta would rebuild, or a tool
count that crosses ``index: auto``'s threshold.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from toolgraph.data.formats import meta_skipped, tool_record
from toolgraph.data.schema import Agent, Tool, ToolDataset
from toolgraph.data.sources.mcp import check_size
from toolgraph.errors import DataError
from toolgraph.files import write_text_atomic
from toolgraph.retrieval.delta import DELTA_FILES, SYNC_STATE, Delta, listed_files, read_delta, write_delta
from toolgraph.retrieval.dense import DenseRetriever
from toolgraph.retrieval.manifest import MANIFEST, add_to_manifest, mark_writing, write_manifest

__all__ = ["COMPACT_AT", "FastSync", "catalog_state", "plan", "write_state"]

STATE_FORMAT = 1
COMPACT_AT = 0.1  # a delta (tools + removals) past this fraction of the base: the full sync writes a new base
MAX_QUERIES_BYTES = 1 << 16  # a queries.jsonl this small is read to see it is blank; a bigger one has queries


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def record_digest(tool: Tool) -> str:
    """A digest of the tool's fields (keys sorted: the same fields in another order are the same tool)."""
    return _digest(json.dumps(tool.to_dict(), ensure_ascii=False, sort_keys=True, default=str).encode())


def _lines(path: Path) -> list[tuple[int, bytes]] | None:
    """(line number, bytes) of each non-blank line, as ``iter_jsonl`` numbers them; None for a file the
    byte-level split might read otherwise (a BOM, carriage returns)."""
    data = path.read_bytes()
    if b"\r" in data or data.startswith(codecs.BOM_UTF8):
        return None
    return [(n, line) for n, line in enumerate(data.split(b"\n"), 1) if line.strip()]


def _agents_sha(catalog: Path) -> str | None:
    path = catalog / "agents.jsonl"
    if not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _plain_folder(catalog: Path) -> bool:
    """A dataset folder with tools only (and agents): no dependencies, no queries (a blank file is none)."""
    if not (catalog.is_dir() and (catalog / "tools.jsonl").is_file()) or (catalog / "dependencies.jsonl").exists():
        return False
    queries = catalog / "queries.jsonl"
    if queries.exists():
        size = queries.stat().st_size
        if size > MAX_QUERIES_BYTES or queries.read_bytes().strip():
            return False
    return True


def catalog_state(catalog: str | Path, tools: list[Tool], agents: list[Agent], max_text_chars: int) -> dict | None:
    """The state a full sync of ``catalog`` (a dataset folder whose tools, in file order, are ``tools``)
    leaves for the next one; None for a catalog the fast path does not read."""
    catalog = Path(catalog)
    if not _plain_folder(catalog):
        return None
    lines = _lines(catalog / "tools.jsonl")
    if lines is None or len(lines) != len(tools):  # a line iter_jsonl reads as blank (unicode spaces)
        return None
    return {"format": STATE_FORMAT,
            "catalog": {"max_text_chars": max_text_chars, "agents_sha256": _agents_sha(catalog),
                        "agents": sorted(a.id for a in agents)},
            "tools": [[_digest(line), t.id, t.agent, record_digest(t)] for (_, line), t in zip(lines, tools)]}


def write_state(folder: Path, state: dict) -> None:
    """``sync-state.json`` into a saved index folder, listed in its manifest."""
    write_text_atomic(folder / SYNC_STATE, json.dumps(state, ensure_ascii=False, separators=(",", ":")))
    add_to_manifest(folder, [SYNC_STATE])


def _read_state(index: Path, files: dict) -> dict | None:
    if SYNC_STATE not in files:
        return None
    try:
        state = json.loads((index / SYNC_STATE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    ok = isinstance(state, dict) and state.get("format") == STATE_FORMAT and isinstance(state.get("tools"), list)
    return state if ok and isinstance(state.get("catalog"), dict) else None


@dataclass
class FastSync:
    """What a fast sync writes: computed by :func:`plan`, encoded, then written by :meth:`write`."""

    index: Path
    retriever: DenseRetriever  # the index's config and encoder, no tools
    meta: dict  # its retriever.json
    old: Delta  # the index's delta (empty when it has none)
    todo: list[Tool]  # added or changed: encoded
    leaving: set[str]  # live ids gone or changed
    counts: dict[str, Any]
    state: dict
    lines_changed: bool  # a catalog line was parsed or went: the state (at least) is new

    def encode(self) -> torch.Tensor:
        vectors = self.retriever.encode_tools(self.todo)
        self.counts["encoded"] = self.retriever.encoded
        return vectors

    def delta(self, vectors: torch.Tensor) -> Delta:
        keep = [j for j, t in enumerate(self.old.tools) if t.id not in self.leaving]
        held = {t.id for t in self.old.tools}
        removed = self.old.removed + sorted(i for i in self.leaving if i not in held)
        rows = self.old.vectors[keep] if keep else torch.zeros(0, vectors.shape[1] if len(vectors) else 0)
        if len(rows) and len(vectors):
            stacked = torch.cat([rows, vectors])
        else:
            stacked = rows if len(rows) else vectors
        return Delta(self.old.base_tools, removed, [self.old.tools[j] for j in keep] + self.todo, stacked)

    def write(self, vectors: torch.Tensor, folder: Path) -> None:
        """The new index into the empty ``folder``: the old one's base files hard-linked (copied where a
        link cannot be made), the delta, retriever.json, the state, then the manifest."""
        mark_writing(folder)
        skip = {*DELTA_FILES, "retriever.json", MANIFEST}
        for rel in listed_files(self.index) or {}:
            if rel in skip:
                continue
            target = folder / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(self.index / rel, target)
            except OSError:
                shutil.copy2(self.index / rel, target)
        delta = self.delta(vectors)
        write_delta(folder, delta)
        total = self.counts["tools"]
        (folder / "retriever.json").write_text(json.dumps({**self.meta, "tools": total}, indent=2) + "\n")
        write_text_atomic(folder / SYNC_STATE, json.dumps(self.state, ensure_ascii=False, separators=(",", ":")))
        write_manifest(folder, "dense", total, linked_from=self.index)
        self.counts["delta"] = {"tools": len(delta.tools), "removed": len(delta.removed)}


def plan(catalog: str | Path, index: Path, max_text_chars: int) -> FastSync | None:
    """The fast sync of ``catalog`` into the saved ``index``, or None when the full sync must run."""
    catalog = Path(catalog)
    files = listed_files(index)
    if files is None or not _plain_folder(catalog):
        return None
    state = _read_state(index, files)
    try:
        meta = json.loads((index / "retriever.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if state is None or not isinstance(meta, dict) or meta.get("retriever") != "dense":
        return None
    seen = state["catalog"]
    if seen.get("max_text_chars") != max_text_chars or seen.get("agents_sha256") != _agents_sha(catalog):
        return None
    path = catalog / "tools.jsonl"
    lines = _lines(path)
    if lines is None:
        return None
    known = {row[0]: row for row in state["tools"]}
    live = {row[1]: row for row in state["tools"]}
    if len(live) != meta.get("tools"):
        return None
    agents = set(seen.get("agents") or ())
    rows, parsed, ids = [], [], set()
    for lineno, line in lines:
        digest = _digest(line)
        row = known.get(digest)
        if row is None:
            tool = _parse(line, path, lineno, max_text_chars)
            if tool is None or (seen.get("agents_sha256") is not None and tool.agent is not None
                                and tool.agent not in agents):
                return None  # the full sync reads it and says what is wrong, with the line
            row = [digest, tool.id, tool.agent, record_digest(tool)]
            parsed.append((tool, row))
        if row[1] in ids:
            return None  # a repeated id (or line): the full sync's error
        ids.add(row[1])
        rows.append(row)
    todo = [t for t, row in parsed if t.id not in live or live[t.id][3] != row[3]]
    leaving = {i for i in live if i not in ids} | {t.id for t in todo if t.id in live}
    added = sum(t.id not in live for t in todo)
    removed = sum(i not in ids for i in live)
    counts = {"added": added, "removed": removed, "updated": len(todo) - added,
              "unchanged": len(ids) - len(todo), "reindexed": len(ids), "encoded": 0, "tools": len(ids),
              "agents": len({row[2] for row in rows if row[2] is not None})}
    try:
        r = DenseRetriever.for_encoding(index)
        old = read_delta(index)
    except DataError:
        return None
    old = old or Delta(meta["tools"], [], [], torch.zeros(0, 0))
    fast = FastSync(index, r, meta, old, todo, leaving, counts, {**state, "tools": rows},
                    bool(parsed) or len(rows) != len(live))
    return fast if _small_enough(fast, r) else None


def _parse(line: bytes, path: Path, lineno: int, max_text_chars: int) -> Tool | None:
    try:
        tool = tool_record(json.loads(line.decode("utf-8")), path, lineno)
        ToolDataset("catalog", [tool], [])  # the checks a full read makes of each tool (a blank name, ...)
        for field in ("name", "description", "parameters", "returns"):
            check_size(getattr(tool, field, None), field, f"tool {tool.id!r}", path, max_text_chars)
    except (DataError, ValueError, TypeError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    return tool


def _small_enough(fast: FastSync, r: DenseRetriever) -> bool:
    """The composed delta stays under COMPACT_AT of the base, keeps the index kind, and does not make
    the FAISS index rebuild when it is applied (masked rows past ``ann.compact_at``)."""
    base = fast.old.base_tools
    held = {t.id for t in fast.old.tools}
    tools = sum(t.id not in fast.leaving for t in fast.old.tools) + len(fast.todo)
    removed = len(fast.old.removed) + sum(i not in held for i in fast.leaving)
    if tools + removed > COMPACT_AT * base or r.index_kind(base) != r.index_kind(fast.counts["tools"]):
        return False
    if r.index_kind(base) == "exact":
        return True
    try:
        ann = json.loads((fast.index / "ann.json").read_text(encoding="utf-8"))
        rows, masked = len(ann["rows"]), len(ann["masked"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return masked + removed <= r.config.ann.compact_at * (rows + tools)


def skipped_of(catalog: str | Path) -> dict[str, int]:
    """The skip counts a dataset folder's meta.json records (what a full read reports as ``skipped``)."""
    meta = Path(catalog) / "meta.json"
    return meta_skipped(meta) if meta.exists() else {}
