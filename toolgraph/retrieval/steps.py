"""Step-wise querying: retrieve each step of a task on its own, then merge the rankings.

A task like "find a flight to Rome and a hotel there" needs one tool per step; a single query
vector sits between them. Each step is scored separately and the per-step score rows of one task
are merged into one row by a rule:

* ``max`` (default): the best score any step gives it (scores are comparable across steps: one
  scorer, one index). A step that matches an item well puts it high, whatever the other steps say;
* ``interleave``: round robin — every step's rank-1 item first (in step order), then every step's
  rank-2 item, …; each step is guaranteed its best item within the first ``len(steps)`` places, but a
  weak step (a context sentence) gets the same share as a strong one;
* ``rrf``: sum over steps of 1 / (rrf_k + rank in that step). A consensus rule: an item that every
  step ranks moderately beats one that a single step ranks first — the opposite of what a task whose
  steps need different tools wants; kept for comparison.

The default was picked on StableToolBench G1 (agent R@1 / R@5 with T2A: max 0.757 / 0.911,
interleave 0.561 / 0.905, rrf 0.622 / 0.857) and holds on the other ToolBench sets (docs/agents-and-serving.md).

Steps come from the data (``Query.steps``, e.g. MCP tasks' annotated steps) or, where a benchmark
has none, from splitting the request into sentences (``toolgraph.data.request_pieces.sentences``).

A retriever can also split every request it is given on its own (``retriever.query_split``,
:func:`split_scores`): the request's pieces (``toolgraph.data.request_pieces.SPLITS``) are scored and merged by ``max``, so a
request that asks for several things finds each thing's tool ("Create a device named 'iEdge'. After
that, check if my session token is still valid" needs a device tool and a token tool; one vector of the
whole request sits between them). A request of one piece scores as before. With ``cover``
(``retriever.query_split_cover``) every piece's own best tool is then raised above the rest, so a piece
whose best match scores lower than another piece's second or third still gets a place at the top.
"""

from __future__ import annotations

import torch

from toolgraph.data.request_pieces import SPLITS

MERGES = ("rrf", "interleave", "max")


def pieces(queries: list[str], rule: str) -> list[list[str]]:
    """Each of ``queries`` split by ``rule`` (a key of :data:`SPLITS`; ``none``: one piece, the request)."""
    if rule not in SPLITS:
        raise ValueError(f"query split must be one of {tuple(SPLITS)}, got {rule!r}")
    return [SPLITS[rule](q) for q in queries]


def scored_texts(queries: list[str], rule: str, whole: float = 0.0) -> list[list[str]]:
    """The texts scored for each query: its pieces (:func:`pieces`), with the whole request first when
    it has several pieces and ``whole`` weighs it (a request of one piece: that piece, the request)."""
    return [[q, *ps] if whole and len(ps) > 1 else ps for q, ps in zip(queries, pieces(queries, rule), strict=True)]


COVER_STEP = 1e-3  # how far a covered tool sits above the blended top, per unit of its piece's score


def blend_rows(rows: torch.Tensor, whole: float = 0.0, cover: bool = False) -> torch.Tensor:
    """[T, N] score rows of one query's :func:`scored_texts` -> [N]: its best piece's score, or with
    ``whole`` > 0, ``whole * whole request + (1 - whole) * best piece`` (row 0 is the whole request).

    ``cover``: each piece's own best tool is then scored just above the blended top (the top plus
    ``COVER_STEP * (1 + its piece's score)``, so covered tools keep their pieces' order and the rest
    keep their scores): every piece gets a place ahead of the others, as in the first round of an
    interleave, and a fusion that min-max normalises this row sees the others unchanged."""
    if rows.shape[0] == 1:
        return rows[0]
    pieces = rows[1:] if whole else rows
    out = pieces.max(0).values
    if whole:
        out = whole * rows[0] + (1 - whole) * out
    if not cover:
        return out
    best, at = pieces.max(1)  # [P]: each piece's best tool
    lift = torch.full_like(out, float("-inf")).scatter_reduce(0, at, COVER_STEP * (1 + best), "amax")
    return torch.where(lift > float("-inf"), out.max() + lift, out)


def split_scores(score_fn, queries: list[str], rule: str, whole: float = 0.0, cover: bool = False) -> torch.Tensor:
    """[Q, N] scores of ``queries`` when each is split by ``rule`` (a key of :data:`SPLITS`) and its
    pieces' score rows merge by :func:`blend_rows` (``whole``: the whole request's weight beside the best
    piece; ``cover``: each piece's best tool first): one call to ``score_fn`` for every text of every query."""
    texts = scored_texts(queries, rule, whole)
    if rule == "none":
        return score_fn(queries)
    scores, out, lo = score_fn([t for ts in texts for t in ts]), [], 0
    for ts in texts:
        out.append(blend_rows(scores[lo:lo + len(ts)], whole, cover))
        lo += len(ts)
    return torch.stack(out)


def blend_piece_hits(vectors: torch.Tensor, indices: torch.Tensor, counts: list[int], tool_vectors: torch.Tensor,
                     whole: float, k: int, cover: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k hits of each query when its texts (:func:`scored_texts`: the whole request, then its
    pieces) were searched one by one in an approximate index: every tool any of them found is scored
    exactly (``vectors`` [T, H] @ its vector) and blended by :func:`blend_rows` (``cover`` as there: among
    the tools found, each piece's best first); ties by tool position.
    ``indices`` [T, k'] are the hits' positions (-1: none). -> ([Q, k'], [Q, k'])."""
    width = min(k, indices.shape[1])
    out_v, out_i, lo = [], [], 0
    for n in counts:
        found = indices[lo:lo + n].flatten()
        found = found[found >= 0].unique()  # ascending: topk's ties keep the lower position
        merged = blend_rows(vectors[lo:lo + n] @ tool_vectors[found].T, whole, cover)  # [C]
        top = merged.argsort(descending=True, stable=True)[:width]
        out_v.append(merged[top])
        out_i.append(found[top])
        lo += n
    return torch.stack(out_v), torch.stack(out_i)


def ranks(scores: torch.Tensor) -> torch.Tensor:
    """[S, N] scores -> [S, N] 1-based ranks (ties: lower index first, as everywhere)."""
    order = scores.argsort(dim=1, descending=True, stable=True)
    out = torch.empty_like(order)
    out.scatter_(1, order, torch.arange(1, scores.shape[1] + 1).expand_as(order).contiguous())
    return out


def merge_steps(scores: torch.Tensor, rule: str = "max", rrf_k: int = 60) -> torch.Tensor:
    """[S, N] per-step scores of one task -> [N] merged scores (higher is better)."""
    if rule not in MERGES:
        raise ValueError(f"step merge must be one of {MERGES}, got {rule!r}")
    if scores.shape[0] == 1:
        return scores[0]
    if rule == "max":
        return scores.max(0).values
    r = ranks(scores).double()  # [S, N]
    if rule == "rrf":
        return (1.0 / (rrf_k + r)).sum(0).float()
    steps = torch.arange(scores.shape[0], dtype=torch.double).unsqueeze(1)  # [S, 1]
    return -(r * scores.shape[0] + steps).min(0).values.float()  # interleave: earliest (rank, step) slot


def merged_scores(score_fn, step_lists: list[list[str]], rule: str = "max", rrf_k: int = 60) -> torch.Tensor:
    """Score every step of every task in one call to ``score_fn`` ([T, N]), merge per task -> [Q, N]."""
    flat = [s for steps in step_lists for s in steps]
    if any(not steps for steps in step_lists):
        raise ValueError("every task needs at least one step")
    all_scores = score_fn(flat)
    out, lo = [], 0
    for steps in step_lists:
        out.append(merge_steps(all_scores[lo:lo + len(steps)], rule, rrf_k))
        lo += len(steps)
    return torch.stack(out)
