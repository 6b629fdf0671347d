"""Calibration of a classifier's probabilities: temperature scaling (Guo et al., 2017), expected
calibration error with its reliability bins, and the edge threshold of a dependency graph.

All three are fitted or measured on held-out (val) logits; a graph built from calibrated
probabilities keeps an edge when ``p(direction) >= threshold``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor, steps: int = 100) -> float:
    """The T > 0 minimising the NLL of ``softmax(logits / T)`` on (logits [N, K], labels [N])."""
    if logits.numel() == 0:
        return 1.0
    logits, labels = logits.detach().float(), labels.detach().long()
    log_t = torch.zeros(1, requires_grad=True)  # T = exp(log_t) stays positive
    opt = torch.optim.LBFGS([log_t], lr=0.1, max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(logits / log_t.exp(), labels)
        loss.backward()
        return loss

    opt.step(closure)
    t = float(log_t.detach().exp())
    return t if torch.isfinite(torch.tensor(t)) and 1e-2 < t < 1e2 else 1.0


def reliability(probs: torch.Tensor, labels: torch.Tensor, bins: int = 10) -> dict:
    """Expected calibration error of the top-class confidence, and the reliability diagram's bins
    (equal width over [0, 1]: count, mean confidence, accuracy)."""
    conf, pred = probs.float().max(dim=1)
    correct = (pred == labels).float()
    edges = torch.linspace(0, 1, bins + 1)
    rows, ece = [], 0.0
    for i in range(bins):
        upper = conf <= edges[i + 1] if i == bins - 1 else conf < edges[i + 1]
        inside = (conf >= edges[i]) & upper
        n = int(inside.sum())
        if n:
            c, a = float(conf[inside].mean()), float(correct[inside].mean())
            ece += n / len(conf) * abs(c - a)
            rows.append({"bin": [round(float(edges[i]), 2), round(float(edges[i + 1]), 2)], "count": n,
                         "confidence": round(c, 4), "accuracy": round(a, 4)})
    return {"ece": ece, "bins": rows}


def edge_threshold(probs: torch.Tensor, labels: torch.Tensor, dependency: tuple[int, int] = (0, 2),
                   grid: int = 19) -> tuple[float, float]:
    """The probability threshold that maximises the F1 of directed edges, and that F1: each pair
    (probs [N, 3]) gives two directed decisions, class ``dependency[0]`` (a needs b) and
    ``dependency[1]`` (b needs a); an edge is kept when its probability reaches the threshold."""
    scores = torch.cat([probs[:, dependency[0]], probs[:, dependency[1]]]).float()
    gold = torch.cat([labels == dependency[0], labels == dependency[1]])
    best = (0.5, -1.0)
    for t in torch.linspace(0.05, 0.95, grid).tolist():
        kept = scores >= t
        tp = float((kept & gold).sum())
        precision, recall = tp / max(1, int(kept.sum())), tp / max(1, int(gold.sum()))
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        if f1 > best[1]:
            best = (round(t, 4), f1)
    return best
