"""Exact top-k with deterministic tie-breaking (equal scores -> lower index first).

``torch.topk`` is fast but orders ties arbitrarily, and a tie at the K-th place changes
Recall@K. We take torch.topk, re-sort its output by (score desc, index asc), and only for the
rare rows where the K-th score is tied with an item left outside do a full stable sort.

A NaN or infinite score is an error (:class:`NonFiniteScores`), never a ranking: ``torch.topk``
orders NaN first, so one broken vector would be every query's top hit. Retrievers keep their
scores finite by design (masked tools get a large negative number, not -inf).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from toolgraph.errors import ToolgraphError


class NonFiniteScores(ToolgraphError, FloatingPointError):
    """A retriever scored a tool NaN or infinite: its vectors or weights are broken (not the query's fault)."""


def check_scores(scores: torch.Tensor, names: Sequence[Any] | None = None) -> None:
    """Raise :class:`NonFiniteScores` if any of the [Q, N] ``scores`` is NaN or infinite; ``names[j]``
    (an id, or an object with ``.id``) names column j in the message. One sum first: NaN and inf make it
    non-finite (30x cheaper than isfinite); only then is every score looked at. (``nn.storage.all_finite``
    is the same test; not imported here, so that a BM25 config still loads without ``toolgraph.nn``.)"""
    if bool(scores.sum().isfinite()) or bool(torch.isfinite(scores).all()):
        return
    cols = (~torch.isfinite(scores)).reshape(-1, scores.shape[-1]).any(0).nonzero().flatten().tolist()
    first = f"column {cols[0]}" if names is None else repr(getattr(names[cols[0]], "id", names[cols[0]]))
    raise NonFiniteScores(f"the retriever scored {len(cols)} of {scores.shape[-1]} tools NaN or infinite (first: "
                          f"{first}): a vector or weight of the index is broken (a model that diverged?); "
                          "rebuild the index (toolgraph index sync) or re-export the model")


def topk(scores: torch.Tensor, k: int, names: Sequence[Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """scores [Q, N] -> (values [Q, k'], indices [Q, k']) with k' = min(k, N), best first. Scores
    must be finite (:func:`check_scores`; ``names`` name the columns in its error)."""
    check_scores(scores, names)
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
