"""Exact top-k with deterministic tie-breaking (equal scores -> lower index first).

``torch.topk`` is fast but orders ties arbitrarily, and a tie at the K-th place changes
Recall@K. We take torch.topk, re-sort its output by (score desc, index asc), and only for the
rare rows where the K-th score is tied with an item left outside do a full stable sort.
"""

from __future__ import annotations

import torch


def topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """scores [Q, N] -> (values [Q, k'], indices [Q, k']) with k' = min(k, N), best first."""
    n = scores.shape[1]
    k = min(k, n)
    if k == 0:
        empty = scores.new_zeros(scores.shape[0], 0)
        return empty, empty.long()
    values, indices = scores.topk(k, dim=1)  # [Q, k] sorted by value, ties arbitrary
    order = indices.argsort(dim=1)  # index asc
    values, indices = values.gather(1, order), indices.gather(1, order)
    order = values.argsort(dim=1, descending=True, stable=True)  # value desc, ties keep index asc
    values, indices = values.gather(1, order), indices.gather(1, order)
    if k < n:
        # a K-th score shared with an item outside the top-k: the lowest indices must win
        tied = (scores >= values[:, -1:]).sum(1) > k  # [Q]
        rows = tied.nonzero().flatten()
        if rows.numel():
            sub = scores[rows]  # [R, N]
            full = sub.argsort(dim=1, descending=True, stable=True)[:, :k]
            values[rows], indices[rows] = sub.gather(1, full), full
    return values, indices
