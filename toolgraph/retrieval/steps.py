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
has none, from splitting the request into sentences (:func:`sentences`).
"""

from __future__ import annotations

import re

import torch

MERGES = ("rrf", "interleave", "max")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")


def sentences(text: str) -> list[str]:
    """Split a request at sentence ends (., !, ? followed by space); empty pieces dropped."""
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()] or [text]


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
