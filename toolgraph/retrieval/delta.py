"""Base + delta: a dense index that ``index sync`` changes without rewriting its unchanged rows.

A saved dense retriever (``tools.jsonl``, ``tool_vectors.safetensors``, ``ann.faiss`` / ``ann.json``)
is the *base*. A sync that changes few of its tools (retrieval/delta_sync.py) writes the new folder as
the base's files, hard-linked as they are, plus three small files:

    delta.json         {"format": 1, "base_tools": N, "removed": [base tools gone or changed], "tools": M}
    delta.jsonl        the M tools added or changed since the base, one record a line (as tools.jsonl)
    delta.safetensors  {"tool_vectors": [M, H]}: row i is line i's vector

Loading applies it: the base's tools minus ``removed`` plus the delta's, in id order, their vectors
likewise; a FAISS index gets the delta's rows added and the removed ones masked (``AnnIndex.update``),
so the base's index file is never rewritten. A delta belongs to the folder only when the folder's
``manifest.json`` lists ``delta.json``; a save over the folder (``Retriever.save``, a new base)
removes the delta files the old manifest lists (``manifest.mark_writing``), and a stale copy that
no manifest lists is ignored.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from toolgraph.data.formats import read_json
from toolgraph.data.schema import Tool, natural_key
from toolgraph.errors import DataError
from toolgraph.nn.storage import read_matrix
from toolgraph.retrieval.base import read_saved_tools
from toolgraph.retrieval.manifest import DELTA_FILES, MANIFEST

__all__ = ["DELTA_FILES", "Delta", "Merge", "listed_files", "read_delta", "write_delta"]

DELTA_META, DELTA_TOOLS, DELTA_VECTORS, SYNC_STATE = DELTA_FILES  # sync-state.json: retrieval/delta_sync.py
FORMAT = 1
_RESAVE = "sync the index again from its catalog, or re-save the retriever"


@dataclass
class Delta:
    base_tools: int  # rows of the base (its tools.jsonl and tool_vectors)
    removed: list[str]  # base tools left out (gone from the catalog, or changed: their new record is in tools)
    tools: list[Tool]  # added or changed since the base
    vectors: torch.Tensor  # [len(tools), H]


def listed_files(folder: Path) -> dict[str, dict] | None:
    """The ``files`` entry of ``folder``'s manifest (path -> size, sha256); None without a readable one."""
    try:
        files = json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("files")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None
    return files if isinstance(files, dict) else None


def read_delta(folder: Path, width: int | None = None) -> Delta | None:
    """The delta saved in ``folder`` when its manifest lists one, else None. A damaged delta is a
    DataError naming the file."""
    files = listed_files(folder)
    if files is None or DELTA_META not in files:
        return None
    path = folder / DELTA_META
    meta = read_json(path)
    if (not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("base_tools"), int)
            or not isinstance(meta.get("removed"), list) or not all(isinstance(i, str) for i in meta["removed"])
            or not isinstance(meta.get("tools"), int)):
        raise DataError(f'expected {{"format": {FORMAT}, "base_tools": N, "removed": [ids], "tools": M}}; the index '
                        f"is damaged: {_RESAVE}", path)
    tools = read_saved_tools(folder / DELTA_TOOLS)
    if len(tools) != meta["tools"]:
        raise DataError(f"{len(tools)} tools, but {DELTA_META} says {meta['tools']}: {_RESAVE}", folder / DELTA_TOOLS)
    vectors = read_matrix(folder / DELTA_VECTORS, "tool_vectors", len(tools), f"tools of {DELTA_TOOLS}", width=width,
                          width_of="the encoder's")
    return Delta(meta["base_tools"], list(meta["removed"]), tools, vectors)


def write_delta(folder: Path, delta: Delta) -> None:
    """The three delta files in ``folder`` (the caller writes the manifest after them)."""
    with (folder / DELTA_TOOLS).open("w", encoding="utf-8") as f:
        for t in delta.tools:
            f.write(json.dumps(t.to_dict(), ensure_ascii=False) + "\n")
    save_file({"tool_vectors": delta.vectors.float().contiguous()}, str(folder / DELTA_VECTORS))
    meta = {"format": FORMAT, "base_tools": delta.base_tools, "removed": sorted(delta.removed, key=natural_key),
            "tools": len(delta.tools)}
    (folder / DELTA_META).write_text(json.dumps(meta) + "\n", encoding="utf-8")


@dataclass
class Merge:
    """How a delta combines with its base: the live tools in id order, and where each came from."""

    tools: list[Tool]
    kept: torch.Tensor  # base rows kept, in order
    at: torch.Tensor  # output position of each delta tool (delta order)
    changed: set[str]  # ids both removed from the base and in the delta

    @classmethod
    def of(cls, base: list[Tool], delta: Delta, where: Path) -> Merge:
        if len(base) != delta.base_tools:
            raise DataError(f"the delta was written for a base of {delta.base_tools} tools, but tools.jsonl holds "
                            f"{len(base)}: the folder mixes files of two saves; {_RESAVE}", where / DELTA_META)
        gone = set(delta.removed)
        kept = [i for i, t in enumerate(base) if t.id not in gone]
        if len(base) - len(kept) != len(gone):
            held = {t.id for t in base}
            raise DataError(f"removes tool(s) the base does not hold: {sorted(gone - held)[:5]}; {_RESAVE}",
                            where / DELTA_META)
        live = [base[i] for i in kept] if gone else base
        order = sorted(range(len(delta.tools)), key=lambda j: natural_key(delta.tools[j].id))
        tools: list[Tool] = []
        at = [0] * len(order)
        start = 0
        for n, j in enumerate(order):
            t = delta.tools[j]
            pos = bisect.bisect_left(live, natural_key(t.id), lo=start, key=lambda x: natural_key(x.id))
            if pos < len(live) and live[pos].id == t.id:
                raise DataError(f"adds tool {t.id!r}, which the base still holds; {_RESAVE}", where / DELTA_TOOLS)
            tools += live[start:pos]
            start = pos
            at[j] = pos + n
            tools.append(t)
        tools += live[start:]
        if len({t.id for t in delta.tools}) != len(delta.tools):
            raise DataError(f"a tool id is repeated; {_RESAVE}", where / DELTA_TOOLS)
        return cls(tools, torch.tensor(kept, dtype=torch.long), torch.tensor(at, dtype=torch.long),
                   gone & {t.id for t in delta.tools})

    def vectors(self, base: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """The live tools' vectors [len(tools), H] from the base's [N, H] and the delta's [M, H]."""
        width = base.shape[1] if base.numel() else delta.shape[1]
        out = torch.empty(len(self.tools), width)
        from_base = torch.ones(len(self.tools), dtype=torch.bool)
        from_base[self.at] = False
        out[from_base] = base if len(self.kept) == len(base) else base[self.kept]
        out[self.at] = delta
        return out
