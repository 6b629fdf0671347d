"""FAISS indexes behind a dense retriever: exact (``faiss``: IndexFlatIP) or approximate
(``faiss-hnsw``: IndexHNSWFlat; ``faiss-ivf``: IndexIVFFlat over k-means lists), updated in place.

An :class:`AnnIndex` holds the FAISS index, the tool id of each of its rows and the rows removed
since it was built. ``update`` brings it in line with a new tool list: rows of new or changed tools
are added, rows of removed or changed ones are masked out of every search (an ``IDSelectorNot``
over them), so ``add_tools`` / ``remove_tools`` / ``index sync`` cost what changed, not a rebuild.
Once masked rows exceed ``compact_at`` of the index it is rebuilt from the live vectors.

Saved as ``ann.faiss`` (``faiss.write_index``) and ``ann.json`` (kind, parameters, row ids, masked
rows) inside the retriever's folder, so the manifest covers both; a file that does not fit (another
kind or parameters, another row count) is ignored and the index rebuilt.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from toolgraph.config import bounded
from toolgraph.files import write_text_atomic

Kind = Literal["faiss", "faiss-hnsw", "faiss-ivf"]


@dataclass
class AnnConfig:
    """How ``retriever.index: faiss-hnsw | faiss-ivf | auto`` builds and searches."""

    auto_above: int = bounded(50_000, ge=0)  # index: auto -> exact up to this many tools, then auto_kind
    auto_kind: Literal["faiss-hnsw", "faiss-ivf"] = "faiss-hnsw"
    hnsw_m: int = bounded(32, ge=4)  # HNSW: links per node (memory: 8·m bytes a tool beyond its vector)
    ef_construction: int = bounded(80, ge=8)  # HNSW: candidates while inserting (build time vs graph quality)
    ef_search: int = bounded(128, ge=1)  # HNSW: candidates while searching (latency vs recall; at least k)
    ivf_lists: int = bounded(0, ge=0)  # IVF: k-means lists; 0: 4·sqrt(tools), at most tools/39
    nprobe: int = bounded(32, ge=1)  # IVF: lists searched per query
    compact_at: float = bounded(0.2, gt=0.0, le=1.0)  # rebuild once masked rows exceed this fraction


def _params(kind: str, cfg: AnnConfig) -> dict:
    """The parameters an index of ``kind`` was built with (a saved index is reused only under the same)."""
    if kind == "faiss-hnsw":
        return {"hnsw_m": cfg.hnsw_m, "ef_construction": cfg.ef_construction}
    if kind == "faiss-ivf":
        return {"ivf_lists": cfg.ivf_lists}
    return {}


class AnnIndex:
    def __init__(self, kind: Kind, config: AnnConfig):
        self.kind, self.config = kind, config
        self.index = None
        self.row_ids: list[str] = []  # FAISS row -> tool id
        self.masked: set[int] = set()  # rows of tools removed or changed since the build
        self._positions = np.zeros(0, dtype=np.int64)  # FAISS row -> position in the tool list (-1: masked)
        self._selector = None

    # ---- build and update -------------------------------------------------------------------
    def build(self, vectors: torch.Tensor, ids: list[str]) -> None:
        import faiss

        x = np.ascontiguousarray(vectors.numpy(), dtype=np.float32)
        dim = x.shape[1]
        if self.kind == "faiss":
            index = faiss.IndexFlatIP(dim)
        elif self.kind == "faiss-hnsw":
            index = faiss.IndexHNSWFlat(dim, self.config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = self.config.ef_construction
        else:
            lists = self.lists(len(ids))
            index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, lists, faiss.METRIC_INNER_PRODUCT)
            # k-means on 64 vectors a list (FAISS asks for at least 39), a seeded sample of a large catalog
            sample = x if len(x) <= 64 * lists else x[np.random.default_rng(0).choice(len(x), 64 * lists, replace=False)]
            index.train(sample)
        if len(x):
            index.add(x)
        self.index, self.row_ids, self.masked = index, list(ids), set()
        self._positions = np.arange(len(ids), dtype=np.int64)
        self._selector = None

    def lists(self, n: int) -> int:
        if self.config.ivf_lists:
            return max(1, min(self.config.ivf_lists, n))
        return max(1, min(int(4 * math.sqrt(n)), n // 39))

    def update(self, vectors: torch.Tensor, ids: list[str], changed: set[str]) -> None:
        """In line with the tool list ``ids`` (vectors ``[len(ids), H]``, same order); ``changed``: ids
        whose vector differs from the one indexed. New and changed tools are added, gone and changed
        rows masked; past ``compact_at`` masked rows (or with no index yet) it is rebuilt."""
        position = {t: i for i, t in enumerate(ids)}
        live = {t for r, t in enumerate(self.row_ids) if r not in self.masked}
        drop = [r for r, t in enumerate(self.row_ids) if r not in self.masked and (t not in position or t in changed)]
        new = [i for i, t in enumerate(ids) if t not in live or t in changed]
        total = len(self.row_ids) + len(new)
        if self.index is None or (len(self.masked) + len(drop)) > self.config.compact_at * max(total, 1):
            self.build(vectors, ids)
            return
        if new:
            self.index.add(np.ascontiguousarray(vectors[new].numpy(), dtype=np.float32))
            self.row_ids += [ids[i] for i in new]
        self.masked.update(drop)
        self._remap(position)

    def _remap(self, position: dict[str, int]) -> None:
        self._positions = np.fromiter((-1 if r in self.masked else position[t] for r, t in enumerate(self.row_ids)),
                                      dtype=np.int64, count=len(self.row_ids))
        self._selector = None

    # ---- search -----------------------------------------------------------------------------
    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores [Q, k'], positions in the tool list [Q, k']), k' = min(k, live tools)."""
        import faiss

        k = min(k, len(self.row_ids) - len(self.masked))
        x = np.ascontiguousarray(queries.numpy(), dtype=np.float32)
        if k <= 0:
            return torch.zeros(len(x), 0), torch.zeros(len(x), 0, dtype=torch.long)
        if self.kind == "faiss-hnsw":
            params = faiss.SearchParametersHNSW()
            params.efSearch = max(self.config.ef_search, k)
        elif self.kind == "faiss-ivf":
            params = faiss.SearchParametersIVF()
            params.nprobe = min(self.config.nprobe, self.index.nlist)
            # FAISS splits a batch over its queries; fewer queries than threads (a server's single query):
            # over the probed lists instead, so one query uses every core (about half the p95 on 2 cores)
            self.index.parallel_mode = 0 if len(x) >= faiss.omp_get_max_threads() else 1
        else:
            params = faiss.SearchParameters()
        if self.masked:
            if self._selector is None:
                batch = faiss.IDSelectorBatch(np.fromiter(self.masked, dtype=np.int64))
                self._selector = (batch, faiss.IDSelectorNot(batch))  # both kept alive: FAISS holds pointers
            params.sel = self._selector[1]
        values, rows = self.index.search(x, k, params=params)
        positions = np.where(rows >= 0, self._positions[np.maximum(rows, 0)], -1)
        if (positions < 0).any():  # fewer than k found (an IVF probe of small lists): pad with the worst
            values = np.where(positions < 0, np.float32(-1e30), values)
            positions = np.where(positions < 0, 0, positions)
        return torch.from_numpy(values.copy()), torch.from_numpy(positions)

    # ---- persistence ------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        import faiss

        faiss.write_index(self.index, str(folder / "ann.faiss"))
        meta = {"kind": self.kind, "params": _params(self.kind, self.config), "rows": self.row_ids,
                "masked": sorted(self.masked)}
        write_text_atomic(folder / "ann.json", json.dumps(meta))

    @classmethod
    def load(cls, folder: Path, kind: Kind, config: AnnConfig, ids: list[str]) -> AnnIndex | None:
        """The index saved in ``folder`` if it was built as ``kind`` with ``config``'s parameters and its
        live rows are exactly ``ids``; else None (the caller rebuilds)."""
        import faiss

        meta_path, path = folder / "ann.json", folder / "ann.faiss"
        if not (meta_path.is_file() and path.is_file()):
            return None
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("kind") != kind or meta.get("params") != _params(kind, config):
            return None
        ann = cls(kind, config)
        ann.row_ids, ann.masked = list(meta["rows"]), set(meta["masked"])
        live = [t for r, t in enumerate(ann.row_ids) if r not in ann.masked]
        if len(live) != len(ids) or set(live) != set(ids):  # ids are distinct: the same set is the same tools
            return None
        ann.index = faiss.read_index(str(path))
        if ann.index.ntotal != len(ann.row_ids):
            return None
        ann._remap({t: i for i, t in enumerate(ids)})
        return ann

    def describe(self) -> dict:
        return {"kind": self.kind, **_params(self.kind, self.config), "rows": len(self.row_ids),
                "masked": len(self.masked), **asdict(self.config)}
