"""Learned score fusion (``retriever.method: learned``): a logistic regression over features of each
query-tool pair, one group of features per member retriever, fitted on labelled queries of *other*
catalogs and applied to a new one with no labels (benchmarks/general_hybrid.py fits one per
leave-one-dataset-out fold).

Features of member m for query q and tool t, from its scores min-max normalised per query
(``s``, in [0, 1]) over a catalog of N tools:

- ``score``: s;  ``inv_rank``: 1 / rank;
- ``conf``: 1 - the 10th best s of q (how far q's top stands out: a flat ranking is one the member
  is unsure of), and ``score_x_conf``: s · conf;
- ``score_x_log_n``: s · ln N (a lexical match means more in a large catalog than in a small one).

Only the union of every member's top ``candidates`` tools is scored by the model; the rest of the
catalog follows, ordered by the first member. The fitted model is a small JSON file.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from toolgraph.errors import ConfigError

FEATURES = ("score", "inv_rank", "conf", "score_x_conf", "score_x_log_n")
CONF_AT = 10  # conf: 1 - the CONF_AT-th best normalised score


def normalise(scores: torch.Tensor, how: str, mask: torch.Tensor | None = None) -> torch.Tensor:
    """[Q, N] scores rescaled per query (row): ``minmax`` to [0, 1], ``max`` divided by the row's best
    score, ``none`` unchanged. A constant row (no evidence) becomes zeros, never NaN. ``mask`` [Q, N]:
    only its entries set the row's range (the others are rescaled on it, and left to the caller)."""
    if how == "none":
        return scores
    hi = (scores if mask is None else scores.masked_fill(~mask, float("-inf"))).max(dim=1, keepdim=True).values
    if how == "max":
        return torch.where(hi > 0, scores / hi.clamp_min(1e-12), torch.zeros_like(scores))
    lo = (scores if mask is None else scores.masked_fill(~mask, float("inf"))).min(dim=1, keepdim=True).values
    span = hi - lo
    return torch.where(span > 0, (scores - lo) / span.clamp_min(1e-12), torch.zeros_like(scores))


def pair_features(scores: list[torch.Tensor], candidates: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Features [Q, N, len(FEATURES) * members] of every member's [Q, N] scores (one catalog order),
    and the candidate mask [Q, N]: the union of each member's top ``candidates``."""
    q, n = scores[0].shape
    k = min(candidates, n)
    groups, mask = [], torch.zeros(q, n, dtype=torch.bool)
    for raw in scores:
        s = normalise(raw.float(), "minmax")
        order = torch.argsort(s, dim=1, descending=True, stable=True)
        rank = torch.empty_like(s).scatter_(1, order, torch.arange(1, n + 1, dtype=s.dtype).expand(q, n).contiguous())
        conf = (1 - torch.topk(s, min(CONF_AT, n), dim=1).values[:, -1:]).expand(q, n)
        groups.append(torch.stack([s, 1 / rank, conf, s * conf, s * math.log(n)], dim=-1))
        mask.scatter_(1, order[:, :k], True)
    return torch.cat(groups, dim=-1), mask


@dataclass
class FusionModel:
    """Logistic-regression weights over :func:`pair_features` (standardised with ``mean``/``std``)."""

    members: int
    candidates: int
    mean: list[float]
    std: list[float]
    weights: list[float]
    bias: float
    trained_on: list[str] = field(default_factory=list)  # what the examples were (dataset names)

    @property
    def features(self) -> list[str]:
        """The name of each weight: ``member:feature``."""
        return [f"{m}:{f}" for m in range(self.members) for f in FEATURES]

    def score(self, scores: list[torch.Tensor]) -> torch.Tensor:
        """[Q, N] fused scores: the model's logit on candidates; below them, the rest by member 0."""
        if len(scores) != self.members:
            raise ConfigError(f"retriever.members: the fusion model was fitted on {self.members} members, "
                              f"got {len(scores)}")
        x, mask = pair_features(scores, self.candidates)
        z = ((x - torch.tensor(self.mean)) / torch.tensor(self.std)) @ torch.tensor(self.weights) + self.bias
        floor = z[mask].min() if mask.any() else z.new_tensor(0.0)
        return torch.where(mask, z, floor - 2 + normalise(scores[0].float(), "minmax"))

    @classmethod
    def fit(cls, examples: list[tuple[list[torch.Tensor], torch.Tensor]], candidates: int = 30, l2: float = 1e-3,
            names: list[str] | None = None) -> FusionModel:
        """Fit on ``examples``: (the members' [Q, N] scores, the [Q, N] 0/1 gold matrix), one per catalog.
        Each catalog weighs the same in the loss, whatever its number of queries."""
        if not examples:
            raise ValueError("FusionModel.fit: no examples")
        members = len(examples[0][0])
        xs, ys, ws = [], [], []
        for scores, gold in examples:
            if len(scores) != members:
                raise ValueError(f"FusionModel.fit: every example needs {members} members' scores, got {len(scores)}")
            x, mask = pair_features(scores, candidates)
            xs.append(x[mask])
            ys.append(gold.float()[mask])
            ws.append(torch.full((int(mask.sum()),), 1.0 / max(1, int(mask.sum()))))
        x, y, w = torch.cat(xs).double(), torch.cat(ys).double(), torch.cat(ws).double()
        mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
        xn = (x - mean) / std
        theta = torch.zeros(x.shape[1] + 1, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS([theta], max_iter=200, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            logits = xn @ theta[:-1] + theta[-1]
            loss = (F.binary_cross_entropy_with_logits(logits, y, reduction="none") * w).sum() / len(examples)
            loss = loss + l2 * theta[:-1].pow(2).sum()
            loss.backward()
            return loss

        opt.step(closure)
        t = theta.detach()
        return cls(members, candidates, mean.tolist(), std.tolist(), t[:-1].tolist(), float(t[-1]), list(names or []))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**asdict(self), "features": self.features}, indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> FusionModel:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"retriever.model_file: no fusion model at {path}")
        try:
            raw = json.loads(path.read_text())
            names = raw.pop("features")
            model = cls(**raw)
        except (json.JSONDecodeError, TypeError, KeyError, AttributeError) as e:
            raise ConfigError(f"retriever.model_file: {path} is not a fusion model JSON ({type(e).__name__}: {e})") from None
        if names != model.features:
            raise ConfigError(f"retriever.model_file: {path} was fitted on features {names}, this toolgraph "
                              f"computes {model.features}")
        width = len(FEATURES) * model.members
        values = (model.weights, model.mean, model.std)
        if not all(isinstance(v, list) and all(isinstance(x, (int, float)) for x in v) for v in values) \
                or not isinstance(model.bias, (int, float)):
            raise ConfigError(f"retriever.model_file: {path}: weights, mean and std must be lists of numbers, bias a number")
        if not (len(model.weights) == len(model.mean) == len(model.std) == width):
            raise ConfigError(f"retriever.model_file: {path}: weights, mean and std need {width} values each "
                              f"({model.members} members x {len(FEATURES)} features)")
        return model
