"""Contrastive losses as functions of tensors (tested without a model).

In-batch negatives have two classic traps, both handled here:
* a tool that is gold for query i but sampled as the positive of query j would be a false
  negative for i: ``info_nce`` masks every document whose tool is in i's gold set, except i's
  own positive;
* under DDP the negatives silently shrink to the local batch unless documents are gathered from
  every rank *with* gradients: ``gather_with_grad``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` [B, ...] from all ranks -> [W*B, ...], gradients flowing back to owners.

    Identity when not distributed. Ranks must hold the same B (pad otherwise)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x
    import torch.distributed.nn.functional as dist_fn

    return torch.cat(dist_fn.all_gather(x), dim=0)


def gather_no_grad(x: torch.Tensor) -> torch.Tensor:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x
    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x.contiguous())
    return torch.cat(out, dim=0)


def false_negative_mask(gold: torch.Tensor, doc_tools: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """[B, M] True where document j is a gold tool of query i but not i's positive column.

    gold [B, G] tool indices padded with -1; doc_tools [M] tool index of each document column;
    positive [B] the column index of each query's positive."""
    is_gold = (gold.unsqueeze(2) == doc_tools.view(1, 1, -1)).any(1)  # [B, M]
    is_gold &= doc_tools.view(1, -1) >= 0
    is_gold[torch.arange(gold.shape[0], device=gold.device), positive] = False
    return is_gold


def info_nce(q: torch.Tensor, d: torch.Tensor, positive: torch.Tensor, temperature: float,
             mask: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy of each query against all documents; ``positive`` [B] indexes into d [M, H].

    q [B, H], d [M, H]; ``mask`` [B, M] True = excluded (false negatives). Mean over queries."""
    logits = q @ d.T / temperature  # [B, M]
    if mask is not None:
        logits = logits.masked_fill(mask, torch.finfo(logits.dtype).min)
    return F.cross_entropy(logits, positive)


def full_catalog_nce(q: torch.Tensor, tools: torch.Tensor, gold: torch.Tensor, temperature: float,
                     positive: torch.Tensor | None = None, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """InfoNCE of each query against the whole catalog ``tools`` [N, H] instead of a batch's documents.

    gold [B, G] tool indices (-1 padded): no gold tool is ever a negative of its query.
    ``positive`` [B] one gold tool per query (classic InfoNCE over the catalog); None = every gold tool
    is a positive in turn (multi-positive: the mean over a query's gold set of
    ``-log e^{s_g} / (e^{s_g} + sum_{non-gold} e^{s_j})``). ``allowed`` [N] False = not a negative
    (tools a split hides from training). q [B, H]; mean over queries."""
    logits = (q @ tools.T).float() / temperature  # [B, N]
    low = torch.finfo(logits.dtype).min
    if allowed is not None:
        logits = logits.masked_fill(~allowed.view(1, -1), low)
    valid = gold >= 0  # [B, G]
    is_gold = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, gold.clamp(min=0), valid)  # [B, N]
    lse_neg = torch.logsumexp(logits.masked_fill(is_gold, low), dim=1, keepdim=True)  # [B, 1]
    if positive is not None:
        pos, valid = logits.gather(1, positive.view(-1, 1)), torch.ones_like(positive.view(-1, 1), dtype=torch.bool)
    else:
        pos = logits.gather(1, gold.clamp(min=0))  # [B, G]
    per = torch.logaddexp(pos, lse_neg) - pos  # [B, G] -log p(positive | positive + negatives)
    return ((per * valid).sum(1) / valid.sum(1).clamp(min=1)).mean()


def multilabel_loss(logits: torch.Tensor, target: torch.Tensor, kind: str, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Loss of per-item logits [B, C] against a multi-hot ``target`` [B, C] (mean over rows).

    ``bce``: independent sigmoid per item (what the Tool2Vec paper's text describes).
    ``softmax``: cross-entropy of the softmax over items against the target spread evenly over the
    row's positives, i.e. ``-mean_{g in gold} log p_g`` (what its public MLC code trains).
    ``valid`` [B, C] False = padding (excluded from both losses)."""
    target = target.to(logits.dtype)
    if kind == "bce":
        loss = F.binary_cross_entropy_with_logits(logits, target, reduction="none")  # [B, C]
        if valid is None:
            return loss.mean()
        return (loss * valid).sum() / valid.sum().clamp(min=1)
    if kind == "softmax":
        if valid is not None:
            logits = logits.masked_fill(~valid, torch.finfo(logits.dtype).min)
        logp = F.log_softmax(logits, dim=1)  # [B, C]
        n_pos = target.sum(1).clamp(min=1)  # [B]
        return (-(logp.masked_fill(target == 0, 0) * target).sum(1) / n_pos).mean()
    raise ValueError(f"loss must be 'bce' or 'softmax', got {kind!r}")


def category_averaged_ce(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None,
                         class_counts: torch.Tensor | None = None) -> torch.Tensor:
    """TGR's category-averaged loss (Tool Graph Retriever, eq. 2): L = sum_k (1/N_k) sum_{i: y_i=k} l_i,
    l_i the (optionally weighted) cross-entropy of example i.

    ``class_counts=None``: N_k counted in this batch (a class absent from the batch adds nothing).
    ``class_counts`` given (the training set's N_k): each class's batch sum is divided by its
    expected count per batch, N_k * B / N, so the loss keeps the per-batch scale; in expectation
    over batches it equals the dataset form.
    logits [B, K], labels [B] (class index), weights [B], class_counts [K].
    """
    k = logits.shape[1]
    per = F.cross_entropy(logits.float(), labels, reduction="none")  # [B]
    if weights is not None:
        per = per * weights
    sums = torch.zeros(k, device=logits.device).index_add_(0, labels, per)  # [K]
    if class_counts is None:
        n = torch.bincount(labels, minlength=k).float()  # [K]
    else:
        counts = class_counts.to(logits.device).float()
        n = counts * labels.shape[0] / counts.sum()  # [K] expected per batch
    return (sums / n.clamp(min=1e-12) * (n > 0)).sum()
