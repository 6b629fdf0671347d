"""Dependency-graph construction with the discriminator, below O(N^2).

TGR scores every ordered tool pair (N^2 discriminator calls), which kept it to small catalogs.
Here only candidate pairs are scored: each tool's ``top_m`` nearest tools by embedding, plus pairs
sharing an owner agent or a category (groups up to ``max_group``). Each unordered pair is read
once: the 3-way output gives both directions. Scoring runs through Lightning ``predict``, so
``devices``/``strategy`` spread it over many GPUs (outputs are gathered across ranks).

    toolgraph graph build --discriminator runs/discriminator --data seal-tools --out graphs/seal top_m=10

writes ``edges.jsonl`` (``{"source", "target", "prob"}``: source needs target, every direction with
prob >= ``keep_prob``, so TGR can re-threshold without re-scoring) and ``stats.json`` (pairs scored
against N^2, gold edges covered by the candidates and recovered at ``threshold``, seconds).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from toolgraph.data.schema import Tool, ToolDataset, natural_key
from toolgraph.data.tdi import LABEL_INDEX, Pair
from toolgraph.files import atomic_path, write_text_atomic
from toolgraph.retrieval.progress import progress_enabled


@dataclass
class GraphConfig:
    links: str | None = None  # a trained link retriever (configs/dependency_links.yaml run or its retriever/)
    links_m: int = 20  # ... proposing each tool's top-M prerequisites
    top_m: int = 0  # nearest tools per tool by plain embedding similarity
    same_agent: bool = True  # also pair tools of one owner ...
    same_category: bool = True  # ... or one category
    max_group: int = 50  # ... when the group is at most this large
    encoder: str = "all-MiniLM-L6-v2"  # embeddings for the nearest-tool candidates
    tool_text: str | None = None  # None: the style the discriminator was trained on
    threshold: float = 0.5  # probability of a direction kept as an edge (stats; TGR re-thresholds)
    keep_prob: float = 0.05  # directions written to edges.jsonl
    batch_size: int = 128
    accelerator: str = "auto"
    devices: Any = 1
    strategy: str = "auto"


def candidate_pairs(tools: list[Tool], vectors: torch.Tensor | None, cfg: GraphConfig,
                    proposed: list[list[int]] | None = None) -> list[tuple[int, int]]:
    """Unordered pairs (i < j) to score, sorted: ``proposed[i]`` (link-retriever prerequisites of
    tool i), the ``top_m`` nearest by ``vectors`` [N, H] (L2-normalised), and small groups."""
    n = len(tools)
    pairs: set[tuple[int, int]] = set()
    for i, js in enumerate(proposed or []):
        pairs.update((min(i, j), max(i, j)) for j in js if j != i)
    m = min(cfg.top_m, n - 1) if vectors is not None else 0
    if m > 0:
        for lo in range(0, n, 1024):
            sims = vectors[lo:lo + 1024] @ vectors.T  # [b, N]
            rows = torch.arange(lo, min(lo + 1024, n))
            sims[rows - lo, rows] = float("-inf")  # not itself
            nearest = sims.topk(m, dim=1).indices  # [b, m]
            for i, js in zip(rows.tolist(), nearest.tolist(), strict=True):
                pairs.update((min(i, j), max(i, j)) for j in js)
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(tools):
        if cfg.same_agent and t.agent:
            groups.setdefault(f"agent={t.agent}", []).append(i)
        if cfg.same_category and t.category:
            groups.setdefault(f"category={t.category}", []).append(i)
    for members in groups.values():
        if 1 < len(members) <= cfg.max_group:
            pairs.update((a, b) for x, a in enumerate(members) for b in members[x + 1:])
    return sorted(pairs)


def score_pairs(task, documents: dict[str, str], pairs: list[tuple[str, str]],
                cfg: GraphConfig) -> tuple[torch.Tensor, int]:
    """Discriminator probabilities [P, 3] (a_needs_b, none, b_needs_a) for (a, b) pairs, via
    Lightning predict, and this process's global rank (rank outputs are gathered, so every rank
    returns the full matrix; let rank 0 write)."""
    import lightning as L

    from toolgraph.data.pairs import length_sorted_loader

    items = [Pair(a, b, "none", "", "candidate") for a, b in pairs]  # label unused by predict
    # one loader over all pairs: under DDP Lightning shards it with a DistributedSampler
    loader = length_sorted_loader(task.tokenizer, items, documents, task.model_cfg.max_pair_length, cfg.batch_size)
    trainer = L.Trainer(accelerator=cfg.accelerator, devices=cfg.devices, strategy=cfg.strategy, logger=False,
                        enable_checkpointing=False, enable_progress_bar=progress_enabled(), enable_model_summary=False)
    outputs = trainer.predict(task, dataloaders=loader) or []
    local = [(o["index"], o["probs"]) for o in outputs]
    if torch.distributed.is_available() and torch.distributed.is_initialized() and trainer.world_size > 1:
        gathered: list[Any] = [None] * trainer.world_size
        torch.distributed.all_gather_object(gathered, local)
        local = [x for part in gathered for x in part]
    probs = torch.full((len(items), len(LABEL_INDEX)), float("nan"))
    for index, p in local:
        probs[index] = p  # a DistributedSampler may repeat a pair to even out ranks: same values
    if torch.isnan(probs).any():
        raise RuntimeError("some candidate pairs were not scored")
    return probs, trainer.global_rank


def build_graph(ds: ToolDataset, task, cfg: GraphConfig) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Edges (every direction with prob >= keep_prob) and statistics against the dataset's gold
    dependencies (all of its annotated edges); ``stats["rank"]``: this process's global rank."""
    from toolgraph.retrieval.dense import DenseConfig, DenseRetriever

    style = cfg.tool_text or discriminator_tool_text(task)
    tools = sorted(ds.tools, key=lambda t: natural_key(t.id))
    ids = [t.id for t in tools]
    documents = {t.id: t.document(style) for t in tools}
    t0 = time.perf_counter()
    vectors = None
    if cfg.top_m > 0:
        dense = DenseRetriever(DenseConfig(model=cfg.encoder, tool_text=style))
        dense.index(tools)  # same sort order as ``tools``
        vectors = dense.tool_vectors
    proposed = propose_links(tools, documents, cfg) if cfg.links else None
    cand = candidate_pairs(tools, vectors, cfg, proposed)
    t1 = time.perf_counter()
    probs, rank = score_pairs(task, documents, [(ids[i], ids[j]) for i, j in cand], cfg)  # [P, 3]
    t2 = time.perf_counter()
    edges = []
    a_col, b_col = LABEL_INDEX["a_needs_b"], LABEL_INDEX["b_needs_a"]
    for (i, j), p in zip(cand, probs.tolist(), strict=True):
        if p[a_col] >= cfg.keep_prob:
            edges.append({"source": ids[i], "target": ids[j], "prob": round(p[a_col], 5)})
        if p[b_col] >= cfg.keep_prob:
            edges.append({"source": ids[j], "target": ids[i], "prob": round(p[b_col], 5)})
    n = len(tools)
    gold = {(d.source, d.target) for d in ds.dependencies if d.source != d.target}
    kept = {(e["source"], e["target"]) for e in edges if e["prob"] >= cfg.threshold}
    stats = {
        "dataset": ds.name, "tools": n, "n_squared": n * n, "pairs_scored": len(cand),
        "fraction_of_n_squared": len(cand) / max(1, n * n),
        "gold_edges": len(gold),
        "gold_pairs_in_candidates": gold_coverage(ds, ids, cand),
        "gold_edges_recovered": len(kept & gold) / max(1, len(gold)),
        "edges_kept": len(kept), "edge_precision": len(kept & gold) / max(1, len(kept)),
        "seconds_candidates": round(t1 - t0, 2), "seconds_scoring": round(t2 - t1, 2),
        "pairs_per_second": round(len(cand) / max(t2 - t1, 1e-9), 1), "config": asdict(cfg),
        "discriminator_tool_text": style, "rank": rank,
    }
    return edges, stats


def gold_coverage(ds: ToolDataset, ids: list[str], cand: list[tuple[int, int]]) -> float:
    """Share of the dataset's (unordered) gold dependency pairs among the candidate pairs."""
    gold = {frozenset((d.source, d.target)) for d in ds.dependencies if d.source != d.target}
    found = {frozenset((ids[i], ids[j])) for i, j in cand}
    return len(gold & found) / max(1, len(gold))


def discriminator_tool_text(task) -> str:
    """The tool text style a discriminator was trained on (its TDI options, or the stats.json of
    its TDI folder), else ``default``."""
    data = task.cfg.data
    if data.name == "tdi":
        return (data.options or {}).get("tool_text", "default")
    stats = Path(data.name) / "stats.json"
    if stats.is_file():
        return json.loads(stats.read_text()).get("config", {}).get("tool_text", "default")
    return "default"


def propose_links(tools: list[Tool], documents: dict[str, str], cfg: GraphConfig) -> list[list[int]]:
    """Each tool's top ``links_m`` prerequisites by the link retriever (itself excluded). Tools are
    indexed as their rendered document, the form the link retriever was trained on."""
    from toolgraph.data.tdi import LINK_QUERY_PREFIX, document_tool
    from toolgraph.retrieval.loading import load

    retriever = load(cfg.links)
    retriever.index([document_tool(t.id, documents[t.id]) for t in tools])
    order = {t.id: i for i, t in enumerate(tools)}
    ranking = retriever.retrieve([LINK_QUERY_PREFIX + documents[t.id] for t in tools], cfg.links_m + 1,
                                 progress="proposing links")
    return [[order[j] for j in row if j != t.id][: cfg.links_m] for t, row in zip(tools, ranking.ids, strict=True)]


def write_graph(edges: list[dict[str, Any]], stats: dict[str, Any], folder: str | Path) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / "edges.jsonl") as tmp, tmp.open("w", encoding="utf-8") as f:
        for e in edges:
            f.write(json.dumps(e, ensure_ascii=False) + "\n")
    write_text_atomic(folder / "stats.json", json.dumps(stats, indent=2, default=str) + "\n")
    return folder

