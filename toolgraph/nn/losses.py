"""Contrastive losses: functions of tensors (tested without a model), and the objectives a task
trains as loss modules (``ContrastiveLoss`` and its variants ``InBatchNCE``, ``FullCatalogNCE``).

In-batch negatives have two classic traps, both handled here:
* a tool that is gold for query i but sampled as the positive of query j would be a false
  negative for i: ``info_nce`` masks every document whose tool is in i's gold set, except i's
  own positive;
* under DDP the negatives silently shrink to the local batch unless documents are gathered from
  every rank *with* gradients: ``gather_with_grad``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

Encode = Callable[[torch.Tensor], torch.Tensor]  # index tensor [n] -> vectors [n, H]


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
                     positive: torch.Tensor | None = None, allowed: torch.Tensor | None = None,
                     lexical: torch.Tensor | None = None, lexical_weight: float = 0.0) -> torch.Tensor:
    """InfoNCE of each query against the whole catalog ``tools`` [N, H] instead of a batch's documents.

    gold [B, G] tool indices (-1 padded): no gold tool is ever a negative of its query.
    ``positive`` [B] one gold tool per query (classic InfoNCE over the catalog); None = every gold tool
    is a positive in turn (multi-positive: the mean over a query's gold set of
    ``-log e^{s_g} / (e^{s_g} + sum_{non-gold} e^{s_j})``). ``allowed`` [N] False = not a negative
    (tools a split hides from training). q [B, H]; mean over queries.

    ``lexical`` [B, N] another scorer's scores in [0, 1] (BM25, min-max normalised per query) fused as the
    hybrid ranks: ``minmax(dense) + lexical_weight * lexical``. With each query's dense range r (max - min
    over the allowed catalog, no gradient) that ranks as ``dense + lexical_weight * r * lexical``, which
    becomes the logit: the encoder learns what the lexical scorer misses (CLEAR, Gao et al. 2021)."""
    scores = (q @ tools.T).float()  # [B, N]
    if lexical is not None and lexical_weight:
        ok = allowed.view(1, -1) if allowed is not None else torch.ones_like(scores, dtype=torch.bool)
        span = (scores.masked_fill(~ok, float("-inf")).amax(1, keepdim=True)
                - scores.masked_fill(~ok, float("inf")).amin(1, keepdim=True)).detach()  # [B, 1]
        scores = scores + lexical_weight * span * lexical.to(scores)
    logits = scores / temperature  # [B, N]
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


# ---- the contrastive objectives as loss modules ----------------------------------------------------
class ContrastiveLoss(nn.Module, ABC):
    """The shared base of the contrastive objectives: a batch's queries scored against documents.

    ``loss(encode_queries, encode_documents, batch)``: ``queries(batch)`` and ``documents(batch)`` say
    which texts the batch encodes (index tensors, read by the caller's two encoders: each maps an index
    tensor to vectors [n, H], with gradient), and ``objective(q, d, batch, documents)`` scores the
    vectors. Variants override ``documents`` and ``objective``; ``nn.gradcache.GradCache`` runs the same
    three steps chunk by chunk. No parameters or buffers (nothing in a task's state dict)."""

    def __init__(self, temperature: float):
        super().__init__()
        self.temperature = temperature

    def queries(self, batch: dict[str, Any]) -> torch.Tensor:
        """[B] the query rows to encode: every query of the batch."""
        return torch.arange(batch["gold"].shape[0])

    @abstractmethod
    def documents(self, batch: dict[str, Any]) -> torch.Tensor:
        """[M] the documents to encode (their meaning is the variant's: batch columns, catalog rows)."""

    @abstractmethod
    def objective(self, q: torch.Tensor, d: torch.Tensor, batch: dict[str, Any], documents: torch.Tensor
                  ) -> torch.Tensor:
        """The loss of query vectors ``q`` [B, H] against document vectors ``d`` [M, H] (``documents``')."""

    def forward(self, encode_queries: Encode, encode_documents: Encode, batch: dict[str, Any]) -> torch.Tensor:
        documents = self.documents(batch)  # first: a variant may draw a random subset
        q = encode_queries(self.queries(batch))
        return self.objective(q, encode_documents(documents), batch, documents)


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class InBatchNCE(ContrastiveLoss):
    """InfoNCE over the batch's documents (``info_nce``). ``batch``: ``doc_tools`` [M] the tool of each
    document column, ``positive`` [B] each query's column, ``gold`` [B, G] (-1 padded); a column whose
    tool is gold for a query is no negative of it (``false_negative_mask``). ``gather``: under DDP the
    documents of every rank, gathered with gradients (``gather_with_grad``), positives offset by rank.
    ``documents``: the batch's columns 0..M-1."""

    def __init__(self, temperature: float, gather: bool = True):
        super().__init__(temperature)
        self.gather = gather

    def documents(self, batch: dict[str, Any]) -> torch.Tensor:
        return torch.arange(len(batch["doc_tools"]))

    def objective(self, q: torch.Tensor, d: torch.Tensor, batch: dict[str, Any], documents: torch.Tensor
                  ) -> torch.Tensor:
        cols, positive = batch["doc_tools"], batch["positive"]
        if self.gather and _world() > 1:
            offset = dist.get_rank() * d.shape[0]
            d = gather_with_grad(d)  # [W*M, H]
            cols = gather_no_grad(cols)  # [W*M]
            positive = positive + offset  # this rank's positives sit at its slice
        mask = false_negative_mask(batch["gold"], cols, positive)  # [B, W*M]
        return info_nce(q, d, positive, self.temperature, mask)


class FullCatalogNCE(ContrastiveLoss):
    """InfoNCE of each query against the whole catalog (``full_catalog_nce``). The catalog's vectors are
    ``bank`` [N, H] (no gradient; the owner sets it with ``refresh`` and asks ``stale`` when to), except
    the batch's own tools, which ``documents`` returns as catalog rows to encode with gradient (at most
    ``grad_tools``, a random subset; 0 = all) and which replace their bank rows.

    ``multi_positive``: every gold tool of a query is a positive (else the batch's ``positive`` column's
    tool, ``doc_tools[positive]``). ``allowed`` [N] False = never a negative (tools a split hides from
    training); ``groups`` [N] the source dataset of each tool: a batch (from one dataset) has only its
    own dataset's tools as negatives. Neither is saved: the owner sets them from the data."""

    def __init__(self, temperature: float, multi_positive: bool = False, grad_tools: int = 0,
                 refresh_by: str = "steps", lexical_weight: float = 0.0):
        super().__init__(temperature)
        if refresh_by not in ("steps", "dataset_batches"):
            raise ValueError(f"refresh_by must be 'steps' or 'dataset_batches', got {refresh_by!r}")
        self.multi_positive, self.grad_tools, self.refresh_by = multi_positive, grad_tools, refresh_by
        self.lexical_weight = lexical_weight  # > 0: the batch's "lexical" [B, N] scores fused in (full_catalog_nce)
        self.bank: torch.Tensor | None = None  # [N, H]
        self.bank_step = -1
        self.allowed: torch.Tensor | None = None  # [N] bool
        self.groups: torch.Tensor | None = None  # [N] long
        self.group_clock: dict[int, int] = {}  # groups: each group's clock when its rows were last encoded
        self.group_batches: dict[int, int] = {}  # groups: each group's batches so far

    def reset(self) -> None:
        """Forget the bank (a new fit: nothing encoded yet)."""
        self.bank, self.bank_step, self.group_clock, self.group_batches = None, -1, {}, {}

    def stale(self, step: int, every: int) -> bool:
        """Whether the bank must be re-encoded at optimizer step ``step`` (none yet, or ``every`` steps old)."""
        return self.bank is None or step - self.bank_step >= every

    def due(self, gold: torch.Tensor, step: int, every: int) -> torch.Tensor | None:
        """With ``groups`` (a mixture), called once per training batch: the catalog rows to re-encode
        before the batch whose gold tools are ``gold`` [B, G] (marked refreshed now), or None. Only the
        batch's own dataset's rows, when never encoded or ``every`` old on the ``refresh_by`` clock:
        optimizer ``steps``, or that dataset's own batches (``dataset_batches``). The loss masks every
        other dataset's rows out, so each is encoded when its own batches come; with ``dataset_batches``
        a mixture of many catalogs pays one catalog per ``every`` of its batches (``stale`` is the
        whole-bank rule without groups)."""
        if self.groups is None:
            raise ValueError("FullCatalogNCE.due: only a loss with groups refreshes per group; use stale()")
        group = int(self.groups[int(gold[0, 0])])
        self.group_batches[group] = self.group_batches.get(group, 0) + 1
        clock = step if self.refresh_by == "steps" else self.group_batches[group]
        last = self.group_clock.get(group)
        if self.bank is not None and last is not None and clock - last < every:
            return None
        self.group_clock[group] = clock
        return torch.nonzero(self.groups == group).flatten()

    def refresh(self, bank: torch.Tensor, step: int, rows: torch.Tensor | None = None) -> None:
        """``bank`` [N, H]: every tool's vector; with ``rows`` (from ``due``), the vectors [len(rows), H]
        of those rows only (the others keep theirs, zeros before their first refresh)."""
        if rows is None:
            self.bank, self.bank_step = bank.float(), step
            if self.groups is not None:
                self.group_clock = {g: step if self.refresh_by == "steps" else self.group_batches.get(g, 0)
                                    for g in self.groups.unique().tolist()}
            return
        if self.groups is None:
            raise ValueError("FullCatalogNCE.refresh: rows are refreshed per group; this loss has no groups")
        if self.bank is None:
            self.bank = bank.new_zeros(len(self.groups), bank.shape[-1], dtype=torch.float)
        self.bank[rows.to(self.bank.device)] = bank.float().to(self.bank.device)
        self.bank_step = step

    def _positive(self, batch: dict[str, Any]) -> torch.Tensor | None:
        return None if self.multi_positive else batch["doc_tools"][batch["positive"]]  # [B] tool rows

    def documents(self, batch: dict[str, Any]) -> torch.Tensor:
        gold, positive = batch["gold"], self._positive(batch)
        own = torch.unique(gold[gold >= 0] if positive is None else positive)  # the batch's tools
        if self.grad_tools and len(own) > self.grad_tools:  # a random subset; the rest come from the bank
            own = own[torch.randperm(len(own), device=own.device)[:self.grad_tools]]
        return own

    def objective(self, q: torch.Tensor, d: torch.Tensor, batch: dict[str, Any], documents: torch.Tensor
                  ) -> torch.Tensor:
        if self.bank is None:
            raise RuntimeError("FullCatalogNCE: no bank; call refresh() with every tool's vector first")
        gold = batch["gold"]
        allowed = self.allowed.to(q.device) if self.allowed is not None else None
        if self.groups is not None:  # a mixture batch comes from one dataset: its catalog only
            group = self.groups.to(q.device)
            same = group == group[gold[0, 0]]
            allowed = same if allowed is None else allowed & same
        self.bank[documents] = d.detach().float()  # the freshest vectors stay in the bank
        tools = self.bank.index_copy(0, documents, d.float())  # [N, H]: gradient flows into the batch's rows
        lexical = batch.get("lexical") if self.lexical_weight else None
        if self.lexical_weight and lexical is None:
            raise RuntimeError("FullCatalogNCE: lexical_weight is set but the batch has no 'lexical' scores")
        return full_catalog_nce(q.float(), tools, gold, self.temperature, self._positive(batch), allowed,
                                None if lexical is None else lexical.to(q.device), self.lexical_weight)
