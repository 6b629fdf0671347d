"""``toolgraph index feedback`` and ``toolgraph index train``: an agent's usage log into a live index.

    toolgraph index feedback agent_log.jsonl --index runs/mcp_index     # add a log (all or nothing)
    toolgraph index feedback --remove --query "my address is ..." --index runs/mcp_index
    toolgraph index feedback --remove --before 2026-06-01 --index runs/mcp_index
    toolgraph index train --index runs/mcp_index                        # past --min-queries: train on the log

``feedback`` reads the whole log first (``data/usage_log.py``: a bad line or a tool id the index's catalog
lacks is a DataError naming file and line, and nothing is applied), then, under the index lock (the one
``index sync`` holds), loads the index, merges the log into its store (one entry per (query, tool set),
the oldest dropped past ``--cap``), encodes the queries new to the store, and swaps the new index in
atomically (``sync.save_atomically``'s swap): a running ``toolgraph serve`` reloads it as after a sync,
and a kill at any moment leaves the old index served. An index without a store becomes a ``feedback``
index over itself (``retrieval/feedback.py``); ``index sync`` keeps the store.

``train`` writes the store's successful entries as a dataset (``log_dataset``: train + a seeded 10 % val),
trains the fast bi-encoder on it (``configs/index_train.yaml``; ``--config`` another), and swaps in the
index with the trained encoder as its model: an agent index keeps its router and takes the encoder as its
dense member; any other index becomes the trained dense retriever. The store is kept (the log stays the
source of truth) and re-encoded with the new encoder; entries added while training ran are kept too.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolgraph.data.usage_log import dedupe, merge, parse_time, read_log, remove
from toolgraph.errors import ConfigError, DataError
from toolgraph.retrieval.base import Retriever
from toolgraph.retrieval.dense import embedding_cache_off
from toolgraph.retrieval.feedback import FeedbackRetriever, wrap
from toolgraph.retrieval.loading import load, recover
from toolgraph.sync import LOCK_WAIT, _check_target, _swap_in, _write_errors, index_lock, resolve_index

TRAIN_CONFIG = "configs/index_train.yaml"
MIN_QUERIES = 1000  # a floor against training on a handful of requests (benchmarks/results/feedback.json: which wins)


def _load_index(index: Path) -> FeedbackRetriever:
    if not _check_target(index):
        raise ConfigError(f"--index {index}: no index there; build one first: toolgraph index sync CATALOG --index "
                          f"{index}")
    r = load(index)
    return r if isinstance(r, FeedbackRetriever) else wrap(r)


def apply_feedback(log: str | Path | None, index: str | Path, wait: float = LOCK_WAIT, cap: int | None = None,
                   remove_queries: Sequence[str] = (), before: Any = None, now: float | None = None) -> dict[str, Any]:
    """Add ``log`` to the index's store and/or remove entries (``remove_queries`` by text, ``before``: a
    time, ISO 8601 or Unix seconds); ``cap``: the store's new size limit (kept in the index). Returns
    the counts. Nothing changes unless the whole log is good."""
    if log is None and not remove_queries and before is None and cap is None:
        raise ConfigError("index feedback: give a LOG.jsonl, or --remove with --query / --before, or --cap")
    cutoff = None
    if before is not None:
        try:
            cutoff = parse_time(before, "--before")
        except ValueError as e:
            raise ConfigError(str(e)) from None
    shown, index = str(index), resolve_index(index)
    with _write_errors(index), index_lock(index, wait):
        recover(index)
        r = _load_index(index)
        lines, new = 0, []
        if log is not None:
            entries = read_log(log, {t.id for t in r.tools}, now)  # all or nothing: raises before any change
            lines, new = len(entries), dedupe(entries)
        before_count = len(r.entries)
        kept = remove(r.entries, remove_queries, cutoff) if (remove_queries or cutoff is not None) else list(r.entries)
        removed = before_count - len(kept)
        if cap is not None:
            r.config.max_queries = cap
        known = {e.key for e in kept}
        added = sum(e.key not in known for e in new)
        merged, dropped = merge(kept, new, r.config.max_queries)
        with embedding_cache_off():  # the index keeps the vectors: no cache_dir is written
            encoded = r.set_entries(merged)
        _swap_in(r, index)
    return {"index": shown, "lines": lines, "added": added, "repeated": lines - added, "removed": removed, "dropped_by_cap": dropped,
            "stored": len(r.entries), "failed_kept_out": sum(not e.ok for e in r.entries), "encoded": encoded}


def train_index(index: str | Path, out: str | Path | None = None, config: str | Path = TRAIN_CONFIG,
                overrides: Sequence[str] = (), min_queries: int = MIN_QUERIES, wait: float = LOCK_WAIT,
                val_fraction: float = 0.1, seed: int = 0) -> dict[str, Any]:
    """Train the fast bi-encoder on the index's store and swap the index over to it (module docstring)."""
    from toolgraph.config import load_config
    from toolgraph.data.formats import write_dataset
    from toolgraph.data.usage_log import log_dataset
    from toolgraph.training import TrainConfig, train

    shown, index = str(index), resolve_index(index)
    recover(index)
    r = _load_index(index)
    ok = [e for e in r.entries if e.ok]
    if len(ok) < min_queries:
        raise ConfigError(f"--index {shown}: {len(ok)} successful logged queries, fewer than --min-queries "
                          f"{min_queries}; the log's votes already serve it (toolgraph index feedback): log more, or "
                          "lower --min-queries to train anyway")
    if not Path(config).is_file():
        raise ConfigError(f"--config {config}: not found; index train reads its recipe from it (run from the "
                          "repository root, or give --config)")
    out = Path(out) if out is not None else index.parent / f"{index.name}.train"
    ds = log_dataset(r.tools, ok, r.agents, val_fraction, seed, name=f"{index.name}-log")
    data = write_dataset(ds, out / "log_dataset")
    cfg = load_config(TrainConfig, [config], [*schedule(len(ds.split("train"))), f"data.name={data}", f"out_dir={out / 'run'}",
                                              "test=false", "data.split=val", "data.test_split=val", *overrides])  # a log has no test
    start = time.perf_counter()
    summary = train(cfg)
    seconds = time.perf_counter() - start
    exported = out / "run" / "retriever"
    if not (exported / "retriever.json").is_file():
        raise DataError("training exported no retriever (export: false in the config?); the index was not changed",
                        exported)
    with _write_errors(index), index_lock(index, wait):
        recover(index)
        live = _load_index(index)  # entries and catalog as they are now (a feedback or sync ran meanwhile)
        base = _trained_base(live.base, exported)
        new = FeedbackRetriever(type(live.config)(**{**vars(live.config), "encoder": None}), base=base)
        with embedding_cache_off():
            _index_like(base, live.base)
            new.refresh()
            new.set_entries(list(live.entries))
        _swap_in(new, index)
    print(f"toolgraph index train: {shown} now ranks with {exported} (trained {seconds:.0f} s on {len(ok)} "
          "logged queries)", file=sys.stderr)
    return {"index": shown, "trained_on": len(ok), "seconds": round(seconds, 1), "model": str(exported),
            "val_metrics": (summary or {}).get("metrics") or {},
            "stored": len(new.entries)}


def schedule(n_train: int, batch: int = 128, min_steps: int = 100, min_epochs: int = 5,
             validations: int = 10) -> list[str]:
    """The overrides that fit the fast recipe to a log of ``n_train`` training queries: its batch (or the
    whole log when smaller; an incomplete last batch is dropped), at least ``min_steps`` optimizer steps
    (``min_epochs`` epochs when that is more), validated about ``validations`` times."""
    batch = max(1, min(batch, n_train))
    per_epoch = max(1, n_train // batch)
    epochs = max(min_epochs, -(-min_steps // per_epoch))
    return [f"data.batch_size={batch}", f"trainer.max_epochs={epochs}",
            f"trainer.check_val_every_n_epoch={max(1, epochs // validations)}"]


def _trained_base(old: Retriever, exported: Path) -> Retriever:
    """The index's new retriever: an agent index with the trained encoder as its dense member, else the
    trained dense retriever."""
    from toolgraph.retrieval.agents import AgentRetriever

    trained = load(exported)
    if isinstance(old, AgentRetriever):
        scorer = "rrf" if old.config.scorer == "bm25" else old.config.scorer  # BM25 alone would not use it
        return type(old)(type(old.config)(**{**vars(old.config), "dense": None, "scorer": scorer}), dense=trained)
    return trained


def _index_like(new: Retriever, old: Retriever) -> None:
    """Index ``new`` on ``old``'s catalog (tools, and agents for a router)."""
    if hasattr(old, "agents") and hasattr(new, "sync"):
        new.index(old.tools, old.agents)
    else:
        new.index(old.tools)
