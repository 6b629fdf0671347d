"""Dependency-graph construction with the discriminator, below O(N^2).

TGR scores every ordered tool pair (N^2 discriminator calls), which kept it to small catalogs.
Here only candidate pairs are scored: each tool's ``top_m`` nearest tools by embedding, its
``schema_m`` best field-word matches, its ``io_m`` best producers and consumers by embedded inputs
vs outputs, a link retriever's proposals, pairs used together in training requests, plus pairs
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
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from toolgraph.config import TextEncoderSpec, accepts_renamed
from toolgraph.data.schema import Tool, ToolDataset, natural_key
from toolgraph.data.tdi import LABEL_INDEX
from toolgraph.files import atomic_path, write_text_atomic
from toolgraph.retrieval.progress import progress_enabled


@accepts_renamed
@dataclass
class GraphConfig:
    links: str | None = None  # a trained link retriever (configs/dependency_links.yaml run or its retriever/)
    links_m: int = 20  # ... proposing each tool's top-M prerequisites
    schema_m: int = 0  # each tool's top-M prerequisites and dependents by field words (schema blocking)
    io_m: int = 0  # each tool's top-M producers and consumers by embedded inputs vs outputs (io_candidates)
    io_doc_weight: float = 1.0  # ... the tool documents' weight next to the field texts
    max_df: int = 200  # ... a field word in more tools than this is too common to block on
    usage_splits: list[str] = field(default_factory=list)  # also pairs used in one request of these splits
    top_m: int = 0  # nearest tools per tool by plain embedding similarity
    same_agent: bool = True  # also pair tools of one owner ...
    same_category: bool = True  # ... or one category
    max_group: int = 50  # ... when the group is at most this large
    encoder: TextEncoderSpec = field(default_factory=TextEncoderSpec)  # embeddings for the nearest-tool candidates
    tool_text: str | None = None  # None: the style the discriminator was trained on
    threshold: float | None = None  # edge kept at this probability (stats); None: the discriminator's val choice
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


def schema_candidates(tools: list[Tool], m: int, max_df: int = 200) -> list[list[int]]:
    """Schema blocking: for each tool, the ``m`` tools most likely to feed it and the ``m`` it most
    likely feeds, by the field words they share. Tool a takes words (its parameter names, as word
    tokens and as whole names); tool b offers words (its return names, and its name: a tool without a
    return schema is still named for what it makes, ``hash_string`` feeds ``hashed_name``). A pair
    scores the IDF of the words a takes and b offers. Words offered or taken by more than ``max_df``
    tools are skipped, so the work is at most ``max_df``² per word: linear in the catalog, not N²."""
    from collections import Counter, defaultdict

    from toolgraph.data.schema import param_names
    from toolgraph.nn.pair_features import tokens as field_tokens
    from toolgraph.nn.pair_features import words as field_words

    takes: dict[str, set[int]] = defaultdict(set)
    offers: dict[str, set[int]] = defaultdict(set)
    for i, t in enumerate(tools):
        for name in param_names(t.parameters):
            takes[field_words(name)].add(i)
            for w in field_tokens(name):
                takes[w].add(i)
        for name in param_names(t.returns) + [t.name]:
            offers[field_words(name)].add(i)
            for w in field_tokens(name):
                offers[w].add(i)
    n = len(tools)
    feeds: list[Counter] = [Counter() for _ in range(n)]  # feeds[a][b]: how well b can feed a
    fed: list[Counter] = [Counter() for _ in range(n)]
    for word, consumers in sorted(takes.items()):  # a fixed order: equal scores break the same way every run
        suppliers = offers.get(word)
        if not suppliers or len(consumers) > max_df or len(suppliers) > max_df:
            continue
        idf = math.log(n / len(consumers | suppliers)) + 1.0
        for a in sorted(consumers):
            for b in sorted(suppliers):
                if a != b:
                    feeds[a][b] += idf
                    fed[b][a] += idf
    def best(scores: Counter) -> list[int]:
        return [j for j, _ in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:m]]  # ties: lower index

    return [best(feeds[i]) + best(fed[i]) for i in range(n)]


def io_texts(tool: Tool) -> tuple[str, str]:
    """What a tool takes and what it gives, as text to embed: ``inputs: name: description; ...`` and
    ``<name as words>. outputs: name: description; ...`` (a tool without a return schema is still
    named for what it makes)."""
    from toolgraph.data.schema import param_fields
    from toolgraph.nn.pair_features import words

    def fields(schema) -> str:
        return "; ".join(f"{words(n)}: {d}".rstrip(": ") for n, d in param_fields(schema))

    return f"inputs: {fields(tool.parameters)}", f"{words(tool.name)}. outputs: {fields(tool.returns)}"


def io_candidates(tools: list[Tool], embed, m: int, doc_weight: float = 1.0, style: str = "default",
                  block: int = 1024) -> list[list[int]]:
    """Embedding blocking: for each tool, the ``m`` tools whose outputs best match its inputs and the
    ``m`` whose inputs its outputs best match. A consumer vector (inputs + ``doc_weight`` × document)
    against a producer vector (outputs + ``doc_weight`` × document) sums four cosines: inputs vs
    outputs, inputs vs the producer's document, the consumer's document vs outputs, document vs
    document. ``embed``: texts -> [n, H] L2-normalised (cached). One maximum inner product search per
    side; exact here, by blocks of ``block`` rows (an ANN index takes its place for large catalogs)."""
    if m <= 0 or len(tools) < 2:
        return [[] for _ in tools]
    texts = [io_texts(t) for t in tools]
    docs = embed([t.document(style) for t in tools])
    takes = torch.nn.functional.normalize(embed([i for i, _ in texts]) + doc_weight * docs, dim=-1)
    gives = torch.nn.functional.normalize(embed([o for _, o in texts]) + doc_weight * docs, dim=-1)
    n, m = len(tools), min(m, len(tools) - 1)
    out: list[list[int]] = [[] for _ in tools]
    for q, k in ((takes, gives), (gives, takes)):  # producers of each tool, then its consumers
        for lo in range(0, n, block):
            sims = q[lo:lo + block] @ k.T  # [b, N]
            rows = torch.arange(lo, min(lo + block, n))
            sims[rows - lo, rows] = float("-inf")
            for i, js in zip(rows.tolist(), sims.topk(m, dim=1).indices.tolist(), strict=True):
                out[i] += js
    return out


def usage_candidates(ds: ToolDataset, ids: list[str], splits: list[str], max_tools: int = 20) -> list[list[int]]:
    """Tools used together in one request of ``splits`` (the catalog's usage log; training splits
    only, so evaluation requests never propose their own pairs). Requests with more than
    ``max_tools`` tools are skipped: they say little about any one pair."""
    index = {t: i for i, t in enumerate(ids)}
    out: list[list[int]] = [[] for _ in ids]
    for q in ds.queries:
        if q.split in splits and len(q.tools) <= max_tools:
            used = [index[t] for t in q.tools if t in index]
            for a in used:
                out[a] += [b for b in used if b != a]
    return out


def score_pairs(task, tools: dict[str, Tool], pairs: list[tuple[str, str]], style: str,
                cfg: GraphConfig) -> tuple[torch.Tensor, int]:
    """Discriminator probabilities [P, 3] (a_needs_b, none, b_needs_a) for (a, b) pairs, via
    Lightning predict, and this process's global rank (rank outputs are gathered, so every rank
    returns the full matrix; let rank 0 write)."""
    import lightning as L

    # one loader over all pairs: under DDP Lightning shards it with a DistributedSampler
    loader = task.pair_loader(tools, pairs, style, cfg.batch_size)
    trainer = L.Trainer(accelerator=cfg.accelerator, devices=cfg.devices, strategy=cfg.strategy, logger=False,
                        enable_checkpointing=False, enable_progress_bar=progress_enabled(), enable_model_summary=False)
    outputs = trainer.predict(task, dataloaders=loader) or []
    local = [(o["index"], o["probs"]) for o in outputs]
    if torch.distributed.is_available() and torch.distributed.is_initialized() and trainer.world_size > 1:
        gathered: list[Any] = [None] * trainer.world_size
        torch.distributed.all_gather_object(gathered, local)
        local = [x for part in gathered for x in part]
    probs = torch.full((len(pairs), len(LABEL_INDEX)), float("nan"))
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
    dense = DenseRetriever(DenseConfig(encoder=cfg.encoder, tool_text=style)) if cfg.top_m > 0 or cfg.io_m > 0 else None
    if cfg.top_m > 0:
        dense.index(tools)  # same sort order as ``tools``
        vectors = dense.tool_vectors
    proposed = propose_links(tools, documents, cfg) if cfg.links else [[] for _ in tools]
    if cfg.schema_m > 0:
        proposed = [p + q for p, q in zip(proposed, schema_candidates(tools, cfg.schema_m, cfg.max_df), strict=True)]
    if cfg.io_m > 0:  # the same encoder (and embedding cache) as the nearest-tool candidates
        io = io_candidates(tools, dense.embed, cfg.io_m, cfg.io_doc_weight, style)
        proposed = [p + q for p, q in zip(proposed, io, strict=True)]
    if cfg.usage_splits:
        proposed = [p + q for p, q in zip(proposed, usage_candidates(ds, ids, cfg.usage_splits), strict=True)]
    cand = candidate_pairs(tools, vectors, cfg, proposed)
    t1 = time.perf_counter()
    probs, rank = score_pairs(task, {t.id: t for t in tools}, [(ids[i], ids[j]) for i, j in cand], style,
                              cfg)  # [P, 3]
    t2 = time.perf_counter()
    threshold = cfg.threshold if cfg.threshold is not None else float(getattr(task, "edge_threshold", 0.5))
    edges = []
    a_col, b_col = LABEL_INDEX["a_needs_b"], LABEL_INDEX["b_needs_a"]
    for (i, j), p in zip(cand, probs.tolist(), strict=True):
        if p[a_col] >= cfg.keep_prob:
            edges.append({"source": ids[i], "target": ids[j], "prob": round(p[a_col], 5)})
        if p[b_col] >= cfg.keep_prob:
            edges.append({"source": ids[j], "target": ids[i], "prob": round(p[b_col], 5)})
    n = len(tools)
    gold = {(d.source, d.target) for d in ds.dependencies if d.source != d.target}
    kept = {(e["source"], e["target"]) for e in edges if e["prob"] >= threshold}
    stats = {
        "dataset": ds.name, "tools": n, "n_squared": n * n, "pairs_scored": len(cand),
        "fraction_of_n_squared": len(cand) / max(1, n * n),
        "gold_edges": len(gold),
        "gold_pairs_in_candidates": gold_coverage(ds, ids, cand),
        "gold_edges_recovered": len(kept & gold) / max(1, len(gold)),
        "edges_kept": len(kept), "edge_precision": len(kept & gold) / max(1, len(kept)),
        "seconds_candidates": round(t1 - t0, 2), "seconds_scoring": round(t2 - t1, 2),
        "pairs_per_second": round(len(cand) / max(t2 - t1, 1e-9), 1), "config": asdict(cfg),
        "discriminator_tool_text": style, "rank": rank, "edge_threshold": threshold,
        "discriminator": {"model": task.model_cfg.name, "temperature": float(getattr(task, "temperature", 1.0)),
                          "edge_threshold_val": float(getattr(task, "edge_threshold", 0.5))},
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


def write_graph(edges: list[dict[str, Any]], stats: dict[str, Any], folder: str | Path,
                source: str | None = None) -> Path:
    """edges.jsonl (a header line, then one edge per line) and stats.json. The header says what the
    graph is: dataset, tool count, the discriminator (``source``, its model and calibration), the
    edge threshold chosen on its val pairs (TGR's default), and what the probabilities mean."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    header = {"format": "toolgraph-dependency-graph/1", "dataset": stats.get("dataset"), "tools": stats.get("tools"),
              "edges": len(edges), "direction": "source needs target", "prob": "calibrated p(source needs target)",
              "edge_threshold": stats.get("edge_threshold"), "keep_prob": stats.get("config", {}).get("keep_prob"),
              "discriminator": {**stats.get("discriminator", {}), "checkpoint": source}}
    with atomic_path(folder / "edges.jsonl") as tmp, tmp.open("w", encoding="utf-8") as f:
        f.write(json.dumps({"header": header}, ensure_ascii=False) + "\n")
        for e in edges:
            f.write(json.dumps(e, ensure_ascii=False) + "\n")
    write_text_atomic(folder / "stats.json", json.dumps(stats, indent=2, default=str) + "\n")
    return folder

