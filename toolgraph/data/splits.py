"""Split protocols: seeded val carving, transductive filtering, LoSemB's inductive unseen-tool
split, label-noise injection and cross-fitting folds. Every function returns a new ToolDataset and records what it
removed in ``skipped`` (nothing disappears without a count)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

from toolgraph.data.schema import Query, ToolDataset
from toolgraph.errors import DataError


def _natural(s: str) -> tuple:
    return (0, int(s), "") if s.isdigit() else (1, 0, s)


def seeded_assign(ids: list[str], fractions: dict[str, float], seed: int) -> dict[str, str]:
    """Assign ids to named parts with the given fractions (sum <= 1; the rest goes to the last).

    Deterministic for a seed and independent of input order (ids are sorted first)."""
    if any(f < 0 for f in fractions.values()) or sum(fractions.values()) > 1 + 1e-9:
        raise DataError(f"split fractions must be >= 0 and sum to <= 1, got {fractions}")
    order = sorted(ids, key=_natural)
    random.Random(seed).shuffle(order)
    names = list(fractions)
    out: dict[str, str] = {}
    start = 0
    for i, name in enumerate(names):
        n = len(order) - start if i == len(names) - 1 else round(fractions[name] * len(order))
        for qid in order[start:start + n]:
            out[qid] = name
        start += n
    return out


def carve_val(queries: list[Query], fraction: float, seed: int, source: str = "train") -> list[Query]:
    """Move a seeded ``fraction`` of the ``source`` split's queries (``train``, or ``test`` for a
    benchmark whose training data is unlike its test) to val. Other splits are untouched."""
    if not 0 <= fraction < 1:
        raise DataError(f"val fraction must be in [0, 1), got {fraction}")
    if source not in ("train", "test"):
        raise DataError(f"val is carved from 'train' or 'test', got {source!r}")
    ids = [q.id for q in queries if q.split == source]
    if fraction == 0 or not ids:
        return list(queries)
    part = seeded_assign(ids, {"val": fraction, source: 1 - fraction}, seed)
    return [replace(q, split=part[q.id]) if q.id in part else q for q in queries]


def transductive(ds: ToolDataset) -> ToolDataset:
    """Keep only val/test queries whose gold tools all occur in training queries (LoSemB)."""
    seen = {t for q in ds.split("train") for t in q.tools}
    keep, dropped = [], Counter()
    for q in ds.queries:
        if q.split != "train" and not set(q.tools) <= seen:
            dropped[f"transductive: {q.split} query uses a tool unseen in train"] += 1
        else:
            keep.append(q)
    return _derive(ds, keep, dropped, setting="transductive")


def inductive(ds: ToolDataset, ratio: float, seed: int = 0) -> tuple[ToolDataset, list[str]]:
    """LoSemB's inductive protocol: pick ``ratio`` of the test tools (seeded) as unseen and drop
    every train/val query that uses one. The test set is the same for every ratio.

    Returns the new dataset and the sorted unseen tool ids."""
    if not 0 < ratio < 1:
        raise DataError(f"inductive ratio must be in (0, 1), got {ratio}")
    test_tools = sorted({t for q in ds.split("test") for t in q.tools}, key=_natural)
    rng = random.Random(seed)
    unseen = set(rng.sample(test_tools, round(ratio * len(test_tools))))
    keep, dropped = [], Counter()
    for q in ds.queries:
        if q.split != "test" and unseen & set(q.tools):
            dropped[f"inductive: {q.split} query uses an unseen tool"] += 1
        else:
            keep.append(q)
    out = _derive(ds, keep, dropped, setting=f"inductive-{round(ratio * 100)}")
    out.notes["unseen_tools"] = sorted(unseen, key=_natural)
    return out, sorted(unseen, key=_natural)


def inject_noise(ds: ToolDataset, ratio: float, seed: int = 0) -> ToolDataset:
    """Replace ``ratio`` of the train query->tool labels with a wrong tool (LoSemB's noise setting).

    A replaced label is swapped for a uniformly drawn tool that the query does not already use."""
    if not 0 <= ratio < 1:
        raise DataError(f"noise ratio must be in [0, 1), got {ratio}")
    rng = random.Random(seed)
    all_ids = sorted((t.id for t in ds.tools), key=_natural)
    slots = [(i, j) for i, q in enumerate(ds.queries) if q.split == "train" for j in range(len(q.tools))]
    chosen = set(rng.sample(slots, round(ratio * len(slots))))
    queries = list(ds.queries)
    for i, j in sorted(chosen):
        q = queries[i]
        tools = list(q.tools)
        wrong = rng.choice(all_ids)
        while wrong in tools:
            wrong = rng.choice(all_ids)
        tools[j] = wrong
        queries[i] = replace(q, tools=tuple(tools))
    out = _derive(ds, queries, Counter(), setting=f"noise-{round(ratio * 100)}")
    out.notes["noisy_labels"] = len(chosen)
    return out


def crossfit_folds(ds: ToolDataset, k: int, seed: int = 0) -> dict[str, int]:
    """Each training query's cross-fitting fold (0..k-1): k seeded, equal parts of the train split."""
    if k < 2:
        raise DataError(f"cross-fitting needs k >= 2 folds, got {k}")
    part = seeded_assign([q.id for q in ds.split("train")], {str(i): 1 / k for i in range(k)}, seed)
    return {qid: int(i) for qid, i in part.items()}


def crossfit(ds: ToolDataset, k: int, fold: int, seed: int = 0) -> ToolDataset:
    """Drop the training queries of cross-fitting fold ``fold`` (of ``k``): a model trained on the
    rest scores that fold's queries as it scores unseen ones (a stacked reranker's training candidates)."""
    if not 0 <= fold < k:
        raise DataError(f"cross-fitting fold must be in [0, {k}), got {fold}")
    folds = crossfit_folds(ds, k, seed)
    keep = [q for q in ds.queries if folds.get(q.id, -1) != fold]
    dropped = Counter({f"crossfit: train query of fold {fold}/{k}": len(ds.queries) - len(keep)})
    return _derive(ds, keep, dropped, setting=f"crossfit-{k}-{fold}")


def _derive(ds: ToolDataset, queries: list[Query], dropped: Counter, setting: str) -> ToolDataset:
    skipped = Counter(ds.skipped)
    skipped.update(dropped)
    notes = {**ds.notes, "setting": setting}
    return ToolDataset(ds.name, ds.tools, queries, ds.agents, ds.dependencies, skipped, notes)
