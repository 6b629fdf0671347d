"""Schema features of a tool pair, and the head that reads them in both orders.

A dependency is made of fields: b's output feeds one of a's parameters ("a needs b"). For an
ordered pair (a, b) the *direction block* measures how well b can feed a — by exact field names, by
name tokens (``user_id`` ~ ``UserID``), and by embeddings of the field names against each other and
against the other tool's name and description (ToolLinkOS lists no returns: ``hashed_name`` is
filled by a tool that "generates a hash") — and the *symmetric block* how alike the two are
(document cosine, same category, same owner, shared parameter tokens). The pair's features are
``block(a, b) + block(b, a) + symmetric``; swapping the pair swaps the first two blocks.

``SchemaPairHead`` scores both orders and averages them with the classes mirrored, so
``logits(b, a) == logits(a, b)[[2, 1, 0]]`` exactly: the model cannot say that a needs b and that b
needs a from the same evidence. Everything here is plain torch; the encoder that embeds the field
names is the caller's (``embed``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

DIRECTION_FEATURES = (
    "cos_param_return",  # max cosine: a's parameter names vs b's return names
    "exact_param_return",  # a's parameters that b returns by the same (lower-cased) name
    "any_exact_param_return",
    "jaccard_param_return_tokens",
    "cos_param_description",  # a's parameter names vs b's description
    "cos_param_name",  # ... vs b's name
    "cos_return_description",  # b's return names vs a's description
    "param_tokens_in_name",  # share of a's parameter tokens found in b's name
    "has_returns", "has_params", "n_params", "n_returns",
)
SYMMETRIC_FEATURES = ("cos_documents", "same_category", "same_agent", "jaccard_param_tokens")
N_FEATURES = 2 * len(DIRECTION_FEATURES) + len(SYMMETRIC_FEATURES)


def words(name: str) -> str:
    """``getUserID`` / ``user_id`` -> ``get user id``: a field name as words (what an encoder reads well)."""
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return " ".join(w for w in re.split(r"[^A-Za-z0-9]+", s) if w).lower()


def tokens(name: str) -> set[str]:
    """Word tokens of a field name, plural 's' dropped (``user_ids`` ~ ``UserID``)."""
    return {w[:-1] if len(w) > 3 and w.endswith("s") else w for w in words(name).split() if len(w) > 1}


def field_texts(fields: dict[str, Any]) -> list[str]:
    """The texts to embed for one tool's fields (see ``ToolView``)."""
    return [fields.get("description") or fields["name"], words(fields["name"])] + \
        [words(n) for n in fields.get("parameters") or []] + [words(n) for n in fields.get("returns") or []]


@dataclass
class ToolView:
    """One tool's fields, tokenised and embedded once (L2-normalised rows)."""

    document: torch.Tensor  # [H]
    description: torch.Tensor  # [H]
    name: torch.Tensor  # [H]
    params: torch.Tensor  # [p, H]
    returns: torch.Tensor  # [r, H]
    param_names: frozenset[str]
    return_names: frozenset[str]
    param_tokens: frozenset[str]
    return_tokens: frozenset[str]
    name_tokens: frozenset[str]
    category: str | None
    agent: str | None


def tool_view(fields: dict[str, Any], document: torch.Tensor, vectors: dict[str, torch.Tensor]) -> ToolView:
    """``vectors``: text -> embedding for every text of ``field_texts(fields)``."""
    params, returns = list(fields.get("parameters") or []), list(fields.get("returns") or [])
    h = document.shape[-1]

    def rows(names: list[str]) -> torch.Tensor:
        return torch.stack([vectors[words(n)] for n in names]) if names else torch.zeros(0, h)

    return ToolView(
        document=document, description=vectors[fields.get("description") or fields["name"]],
        name=vectors[words(fields["name"])], params=rows(params), returns=rows(returns),
        param_names=frozenset(n.lower() for n in params), return_names=frozenset(n.lower() for n in returns),
        param_tokens=frozenset(t for n in params for t in tokens(n)),
        return_tokens=frozenset(t for n in returns for t in tokens(n)),
        name_tokens=frozenset(tokens(fields["name"])), category=fields.get("category"), agent=fields.get("agent"))


def build_views(fields: dict[str, dict[str, Any]], documents: dict[str, str],
                embed: Callable[[list[str]], torch.Tensor]) -> dict[str, ToolView]:
    """Every tool's view; ``embed`` (texts -> [n, H], normalised) is called once on all distinct texts."""
    ids = sorted(fields)
    texts = sorted({t for i in ids for t in field_texts(fields[i])} | {documents[i] for i in ids})
    matrix = embed(texts)
    vectors = dict(zip(texts, matrix, strict=True))
    return {i: tool_view(fields[i], vectors[documents[i]], vectors) for i in ids}


def _max_cos(x: torch.Tensor, y: torch.Tensor) -> float:
    if x.numel() == 0 or y.numel() == 0:
        return 0.0
    return float((x @ y.reshape(-1, x.shape[-1]).T).max())


def _jaccard(x: frozenset, y: frozenset) -> float:
    return len(x & y) / len(x | y) if x and y else 0.0


def direction_block(a: ToolView, b: ToolView) -> list[float]:
    """How well b's outputs can feed a's inputs ("a needs b"), in ``DIRECTION_FEATURES`` order."""
    exact = len(a.param_names & b.return_names)
    return [
        _max_cos(a.params, b.returns), float(exact), float(exact > 0),
        _jaccard(a.param_tokens, b.return_tokens),
        _max_cos(a.params, b.description), _max_cos(a.params, b.name), _max_cos(b.returns, a.description),
        len(a.param_tokens & b.name_tokens) / len(a.param_tokens) if a.param_tokens else 0.0,
        float(b.returns.shape[0] > 0), float(a.params.shape[0] > 0),
        a.params.shape[0] / 10, b.returns.shape[0] / 10,
    ]


def pair_features(a: ToolView, b: ToolView) -> list[float]:
    """``direction_block(a, b) + direction_block(b, a) + symmetric``: ``N_FEATURES`` numbers."""
    same = [float(x is not None and x == y) for x, y in ((a.category, b.category), (a.agent, b.agent))]
    symmetric = [float(a.document @ b.document), *same, _jaccard(a.param_tokens, b.param_tokens)]
    return direction_block(a, b) + direction_block(b, a) + symmetric


def feature_matrix(views: dict[str, ToolView], pairs: Sequence[tuple[str, str]]) -> torch.Tensor:
    """[P, N_FEATURES] for (a, b) id pairs."""
    if not pairs:
        return torch.zeros(0, N_FEATURES)
    return torch.tensor([pair_features(views[a], views[b]) for a, b in pairs], dtype=torch.float)


def pair_vectors(views: dict[str, ToolView], pairs: Sequence[tuple[str, str]]) -> torch.Tensor:
    """[P, 2H]: ``u * v`` and ``|u - v|`` of the two documents (order-free, so swapping is free)."""
    if not pairs:
        return torch.zeros(0, 0)
    u = torch.stack([views[a].document for a, _ in pairs])
    v = torch.stack([views[b].document for _, b in pairs])
    return torch.cat([u * v, (u - v).abs()], dim=1)


class SchemaPairHead(nn.Module):
    """An MLP over standardised pair features (plus optional order-free document vectors), read in
    both orders and averaged with the classes mirrored: (a_needs_b, none, b_needs_a)."""

    def __init__(self, vector_dim: int = 0, hidden: int = 64, dropout: float = 0.2):
        super().__init__()
        n = len(DIRECTION_FEATURES)
        swap = list(range(n, 2 * n)) + list(range(n)) + list(range(2 * n, N_FEATURES))
        self.register_buffer("swap", torch.tensor(swap), persistent=False)
        self.register_buffer("mean", torch.zeros(N_FEATURES))
        self.register_buffer("std", torch.ones(N_FEATURES))
        self.mlp = nn.Sequential(nn.Linear(N_FEATURES + vector_dim, hidden), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, 3))

    @torch.no_grad()
    def fit_scale(self, features: torch.Tensor) -> None:
        """Standardise with the training pairs' statistics (both orders, so the swap keeps them)."""
        both = torch.cat([features, features[:, self.swap]])
        self.mean.copy_(both.mean(0))
        self.std.copy_(both.std(0).clamp(min=1e-6))

    def _one(self, features: torch.Tensor, vectors: torch.Tensor | None) -> torch.Tensor:
        x = (features - self.mean) / self.std
        return self.mlp(x if vectors is None else torch.cat([x, vectors], dim=1))

    def forward(self, features: torch.Tensor, vectors: torch.Tensor | None = None) -> torch.Tensor:
        """features [B, N_FEATURES], vectors [B, V] or None -> logits [B, 3]."""
        forward = self._one(features, vectors)
        backward = self._one(features[:, self.swap], vectors)
        return (forward + backward[:, [2, 1, 0]]) / 2
