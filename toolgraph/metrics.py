"""Retrieval metrics, exactly as defined in BENCHMARKS.md.

For a query with gold set G and ranking R (best first), R_K its first K:
    recall@K    = |R_K ∩ G| / |G|
    precision@K = |R_K ∩ G| / K
    ndcg@K      = DCG@K / IDCG@K, binary gains, DCG = Σ_{i<=K} rel_i / log2(i+1),
                  IDCG over min(|G|, K) relevant items
    map@K       = Σ_{i<=K, rel_i} P@i / min(|G|, K)
    pass@K      = 1 if G ⊆ R_K else 0            (a.k.a. COMP@K, completeness)
    mrr         = 1 / rank of the first relevant item in the retrieved list (0 if none)
    ndcg_toolbench@K = ToolBench's variant: IDCG from the *retrieved* hits only (inflated;
                  offered for comparison with papers, never the default)

Everything is computed from a boolean hit matrix ``hits[Q, D]`` (D = retrieved depth) and
``n_rel[Q] = |G|`` — so gold items that were not retrieved still count in the denominators,
which torchmetrics' built-in retrieval metrics (relevance known only for the scored documents)
cannot express for a top-k list. :class:`RetrievalMetrics` is a torchmetrics ``Metric`` whose
states are sums, so it reduces correctly across DDP ranks.

Uncertainty: a metric is a mean over queries, so its sampling error is estimated by resampling the
queries with replacement (the percentile bootstrap): :func:`intervals` gives each metric's 95 %
interval, :func:`paired_difference` compares two systems on the *same* queries (resampling the
per-query differences, which is far tighter than comparing two separate intervals).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torchmetrics import Metric

METRICS = ("recall", "precision", "ndcg", "map", "pass", "mrr", "ndcg_toolbench")
DEFAULT_METRICS = ("recall", "precision", "ndcg", "map", "pass", "mrr")


def hit_matrix(rankings: Sequence[Sequence[str]], golds: Sequence[Iterable[str]], depth: int | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rankings of ids and gold id sets -> (hits [Q, D] bool, n_rel [Q] long).

    Duplicate ids in a ranking count once (the first occurrence)."""
    depth = depth or max((len(r) for r in rankings), default=0)
    hits = torch.zeros(len(rankings), depth, dtype=torch.bool)
    n_rel = torch.zeros(len(rankings), dtype=torch.long)
    for q, (ranking, gold) in enumerate(zip(rankings, golds, strict=True)):
        gold = set(gold)
        n_rel[q] = len(gold)
        seen: set[str] = set()
        for i, item in enumerate(ranking[:depth]):
            if item in gold and item not in seen:
                hits[q, i] = True
            seen.add(item)
    return hits, n_rel


def per_query(hits: torch.Tensor, n_rel: torch.Tensor, ks: Sequence[int],
              metrics: Sequence[str] = DEFAULT_METRICS) -> dict[str, torch.Tensor]:
    """Per-query values, keyed ``metric@K`` (``mrr`` has no K). hits [Q, D] bool, n_rel [Q]."""
    unknown = set(metrics) - set(METRICS)
    if unknown:
        raise ValueError(f"unknown metric(s) {sorted(unknown)}; known: {METRICS}")
    Q, D = hits.shape
    h = hits.float()  # [Q, D]
    n = n_rel.float().clamp(min=1)  # [Q]; queries without gold score 0, never NaN
    pos = torch.arange(1, D + 1, dtype=torch.float32)  # [D] 1-based ranks
    disc = 1.0 / torch.log2(pos + 1)  # [D]
    cum_hits = h.cumsum(1)  # [Q, D]
    out: dict[str, torch.Tensor] = {}
    for k in ks:
        if k < 1:
            raise ValueError(f"K must be >= 1, got {k}")
        kk = min(k, D)
        found = cum_hits[:, kk - 1] if kk else torch.zeros(Q)  # [Q] |R_K ∩ G|
        if "recall" in metrics:
            out[f"recall@{k}"] = found / n
        if "precision" in metrics:
            out[f"precision@{k}"] = found / k
        if "ndcg" in metrics or "ndcg_toolbench" in metrics:
            dcg = (h[:, :kk] * disc[:kk]).sum(1)  # [Q]
            cdisc = torch.cat([torch.zeros(1), disc.cumsum(0)]) if D else torch.zeros(1)  # [D+1]
            if "ndcg" in metrics:
                # the ideal list puts min(|G|, K) relevant items first, even past the depth D
                ideal = _ideal_dcg(torch.minimum(n_rel, torch.tensor(k)))
                out[f"ndcg@{k}"] = torch.where(ideal > 0, dcg / ideal.clamp(min=1e-12), torch.zeros(Q))
            if "ndcg_toolbench" in metrics:
                ideal_tb = cdisc[found.long().clamp(max=D)]  # IDCG over the retrieved hits only
                out[f"ndcg_toolbench@{k}"] = torch.where(ideal_tb > 0, dcg / ideal_tb.clamp(min=1e-12), torch.zeros(Q))
        if "map" in metrics:
            prec_at_i = cum_hits[:, :kk] / pos[:kk]  # [Q, kk]
            denom = torch.minimum(n_rel, torch.tensor(k)).float().clamp(min=1)
            out[f"map@{k}"] = (prec_at_i * h[:, :kk]).sum(1) / denom
        if "pass" in metrics:
            out[f"pass@{k}"] = ((found >= n_rel.float()) & (n_rel > 0)).float()
    if "mrr" in metrics:
        first = torch.where(hits.any(1), hits.float().argmax(1) + 1, torch.zeros(Q, dtype=torch.long))
        out["mrr"] = torch.where(first > 0, 1.0 / first.clamp(min=1).float(), torch.zeros(Q))
    return out


def _ideal_dcg(m: torch.Tensor) -> torch.Tensor:
    """Σ_{i<=m} 1/log2(i+1) for each entry of m (long tensor)."""
    top = int(m.max().item()) if m.numel() else 0
    table = torch.cat([torch.zeros(1), (1.0 / torch.log2(torch.arange(2, top + 2, dtype=torch.float32))).cumsum(0)])
    return table[m]


def compute(rankings: Sequence[Sequence[str]], golds: Sequence[Iterable[str]], ks: Sequence[int],
            metrics: Sequence[str] = DEFAULT_METRICS) -> dict[str, float]:
    """Mean over queries of every ``metric@K``."""
    hits, n_rel = hit_matrix(rankings, golds)
    return {name: float(v.mean()) if v.numel() else 0.0 for name, v in per_query(hits, n_rel, ks, metrics).items()}


def bootstrap_means(values: torch.Tensor, samples: int, seed: int = 0) -> torch.Tensor:
    """values [M, Q] (M per-query series over the same Q queries) -> [M, samples] means, each column one
    resample of the queries with replacement (the same resamples for every row). A resample is held as
    how often it draws each query, so the means are one matrix product whatever M is; resamples are drawn
    in chunks so that memory stays near 2**22 numbers whatever Q is. The same seed gives the same result."""
    m, q = values.shape
    if q == 0 or samples < 1:
        raise ValueError(f"bootstrap needs at least one query and one resample (got {q} queries, {samples} samples)")
    g = torch.Generator().manual_seed(seed)
    chunk = max(1, (1 << 22) // q)
    values = values.double()
    out = []
    for start in range(0, samples, chunk):
        idx = torch.randint(0, q, (min(chunk, samples - start), q), generator=g)  # [S', Q]
        counts = torch.zeros(idx.shape, dtype=torch.float64).scatter_add_(1, idx, torch.ones(idx.shape, dtype=torch.float64))
        out.append(values @ counts.T / q)  # [M, S']
    return torch.cat(out, 1)


def intervals(values: dict[str, torch.Tensor], samples: int = 1000, level: float = 0.95,
              seed: int = 0) -> dict[str, tuple[float, float]]:
    """Percentile-bootstrap interval of the mean of each per-query series (``per_query``'s output)."""
    if not values:
        return {}
    names = list(values)
    means = bootstrap_means(torch.stack([values[n].reshape(-1) for n in names]), samples, seed)
    lo = means.quantile((1 - level) / 2, dim=1)
    hi = means.quantile(1 - (1 - level) / 2, dim=1)
    return {n: (float(lo[i]), float(hi[i])) for i, n in enumerate(names)}


def paired_difference(a: torch.Tensor, b: torch.Tensor, samples: int = 10000, level: float = 0.95,
                      seed: int = 0) -> dict[str, float]:
    """Per-query values of two systems on the same queries -> mean(b - a), its percentile-bootstrap
    interval (``low``, ``high``) and a two-sided p-value: twice the smaller share of resampled
    differences on either side of zero (capped at 1; identical systems give 1)."""
    if a.shape != b.shape:
        raise ValueError(f"paired values differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
    d = (b.double() - a.double()).reshape(1, -1)
    means = bootstrap_means(d, samples, seed)[0]
    below, above = float((means <= 0).double().mean()), float((means >= 0).double().mean())
    return {"difference": float(d.mean()), "low": float(means.quantile((1 - level) / 2)),
            "high": float(means.quantile(1 - (1 - level) / 2)), "p": min(1.0, 2 * min(below, above))}


def roll_up(ranking: Sequence[str], owner: dict[str, str]) -> list[str]:
    """Tool ranking -> agent ranking: agents in order of their best-ranked tool (Tool-to-Agent)."""
    seen: dict[str, None] = {}
    for tool in ranking:
        agent = owner.get(tool)
        if agent is not None and agent not in seen:
            seen[agent] = None
    return list(seen)


class RetrievalMetrics(Metric):
    """torchmetrics wrapper: ``update(hits, n_rel)`` per batch, ``compute()`` -> {name: mean}.

    States are sums and a count (``dist_reduce_fx="sum"``), so results are exact under DDP."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, ks: Sequence[int] = (1, 3, 5, 10), metrics: Sequence[str] = DEFAULT_METRICS, prefix: str = ""):
        super().__init__()
        self.ks = tuple(ks)
        self.metric_names = tuple(metrics)
        self.prefix = prefix
        names = list(per_query(torch.zeros(1, max(self.ks), dtype=torch.bool), torch.ones(1, dtype=torch.long),
                               self.ks, self.metric_names))
        self.names = names
        self.add_state("sums", default=torch.zeros(len(names), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, hits: torch.Tensor, n_rel: torch.Tensor) -> None:
        values = per_query(hits.cpu(), n_rel.cpu(), self.ks, self.metric_names)
        self.sums += torch.stack([values[n].double().sum() for n in self.names]).to(self.sums.device)
        self.count += hits.shape[0]

    def compute(self) -> dict[str, torch.Tensor]:
        mean = self.sums / self.count.clamp(min=1)
        return {self.prefix + n: mean[i].float() for i, n in enumerate(self.names)}
