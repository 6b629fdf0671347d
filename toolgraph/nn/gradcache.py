"""GradCache (Gao et al., 2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited
Setup"): the gradient of a contrastive loss over a large batch in the memory of one chunk.

1. encode every chunk of every side without a graph -> the representations;
2. the loss over all representations (each a leaf that requires grad) -> the gradient of the loss
   with respect to each representation;
3. encode each chunk again, with a graph, and back-propagate its slice of that gradient.

The parameters then hold exactly the full-batch gradient. Dropout draws the same masks in both passes
(the random state before each chunk's first pass is restored for its second).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def _rng_state() -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    return torch.get_rng_state(), (torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)


def _set_rng_state(state: tuple[torch.Tensor, list[torch.Tensor] | None]) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])


def grad_cache(loss_fn: Callable[..., torch.Tensor], sides: Sequence[tuple[Callable[[Any], torch.Tensor], Sequence[Any]]],
               backward: Callable[[torch.Tensor, torch.Tensor], None] | None = None) -> torch.Tensor:
    """Back-propagate ``loss_fn(rep_side_0, rep_side_1, ...)`` chunk by chunk; returns the loss (no graph).

    ``sides``: for each side (queries, documents, ...) an ``encode(chunk) -> [n, H]`` function and its
    chunks; a side's representation is its chunks' outputs concatenated in order. ``backward(rep,
    grad)``: how a chunk's gradient is applied (default ``torch.autograd.backward``; a LightningModule
    passes its ``manual_backward``)."""
    backward = backward or (lambda rep, grad: torch.autograd.backward(rep, grad))
    reps, states = [], []
    for encode, chunks in sides:
        parts, side_states = [], []
        for chunk in chunks:
            side_states.append(_rng_state())
            with torch.no_grad():
                parts.append(encode(chunk))
        reps.append(torch.cat(parts).detach().requires_grad_())
        states.append(side_states)
    after = _rng_state()
    loss = loss_fn(*reps)
    grads = torch.autograd.grad(loss, reps)
    for (encode, chunks), grad, side_states in zip(sides, grads, states):
        start = 0
        for chunk, state in zip(chunks, side_states):
            _set_rng_state(state)
            rep = encode(chunk)
            backward(rep, grad[start:start + rep.shape[0]].to(rep.dtype))
            start += rep.shape[0]
    _set_rng_state(after)
    return loss.detach()
