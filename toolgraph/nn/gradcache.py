"""GradCache (Gao et al., 2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited
Setup"): the gradient of a contrastive loss over a large batch in the memory of one chunk.

1. forward: encode every chunk of every side without a graph -> the representations; the loss over
   all of them (each a leaf that requires grad) -> the loss and its gradient with respect to each
   representation, kept;
2. backward (of the returned loss tensor): encode each chunk again, with a graph, and back-propagate
   its slice of that gradient, times the gradient the loss itself receives.

So the loss is an ordinary tensor to its caller: ``loss.backward()`` (Lightning's automatic
optimization, its loss scaling under AMP and its division under ``accumulate_grad_batches``) leaves
the parameters holding exactly the full-batch gradient, and gradient clipping and the optimizer step
come after as usual. Dropout draws the same masks in both passes (the random state before each chunk's
first pass is restored for its second, and the state of the backward's caller afterwards); the second
pass runs under the autocast settings of the first. Single process: each chunk's backward is a
separate ``torch.autograd.backward``, which DDP's gradient reducer does not allow.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from toolgraph.nn.losses import ContrastiveLoss, Encode


def _rng_state() -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    return torch.get_rng_state(), (torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)


def _set_rng_state(state: tuple[torch.Tensor, list[torch.Tensor] | None]) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])


def _autocast_state() -> list[tuple[str, torch.dtype]]:
    """The autocast contexts active now, as (device type, dtype), to re-enter in the backward pass."""
    out = []
    for device in ("cuda", "cpu"):
        try:
            enabled, dtype = torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)
        except (TypeError, AttributeError):  # torch < 2.4
            enabled = torch.is_autocast_enabled() if device == "cuda" else torch.is_autocast_cpu_enabled()
            dtype = torch.get_autocast_gpu_dtype() if device == "cuda" else torch.get_autocast_cpu_dtype()
        if enabled:
            out.append((device, dtype))
    return out


class _Replay(torch.autograd.Function):
    """The loss value as a tensor whose backward calls ``replay(grad of the loss)``. ``anchor``: a leaf
    that requires grad, so that autograd calls this backward at all."""

    @staticmethod
    def forward(ctx: Any, value: torch.Tensor, anchor: torch.Tensor, replay: Callable[[torch.Tensor], None]
                ) -> torch.Tensor:
        ctx.replay = replay
        return value.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:
        ctx.replay(grad)
        ctx.replay = None  # one backward per forward: free the cached gradients
        return None, None, None


def grad_cache(loss_fn: Callable[..., torch.Tensor], sides: Sequence[tuple[Encode, Sequence[Any]]]) -> torch.Tensor:
    """``loss_fn(rep_side_0, rep_side_1, ...)`` computed chunk by chunk: its value as a tensor whose
    ``backward()`` fills the parameters' gradients as a backward through the whole batch would.

    ``sides``: for each side (queries, documents, ...) an ``encode(chunk) -> [n, H]`` function and its
    chunks; a side's representation is its chunks' outputs concatenated in order."""
    reps, states = [], []
    for encode, chunks in sides:
        parts, side_states = [], []
        for chunk in chunks:
            side_states.append(_rng_state())
            with torch.no_grad():
                parts.append(encode(chunk))
        reps.append(torch.cat(parts).detach().requires_grad_())
        states.append(side_states)
    with torch.enable_grad():
        loss = loss_fn(*reps)
        grads = torch.autograd.grad(loss, reps)
    autocast = _autocast_state()

    def replay(scale: torch.Tensor) -> None:
        caller = _rng_state()
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.enable_grad())
            for device, dtype in autocast:
                stack.enter_context(torch.autocast(device, dtype=dtype))
            for (encode, chunks), grad, side_states in zip(sides, grads, states, strict=True):
                start = 0
                for chunk, state in zip(chunks, side_states, strict=True):
                    _set_rng_state(state)
                    rep = encode(chunk)
                    piece = grad[start:start + rep.shape[0]] * scale.to(grad.dtype)
                    torch.autograd.backward(rep, piece.to(rep.dtype))
                    start += rep.shape[0]
        _set_rng_state(caller)

    anchor = torch.zeros((), device=loss.device, requires_grad=True)
    return _Replay.apply(loss.detach(), anchor, replay)


class GradCache(nn.Module):
    """A contrastive loss (``nn.losses.ContrastiveLoss``) run by GradCache in chunks of ``chunk`` texts:
    called like the loss it wraps, it returns the same value, and its ``backward()`` leaves the same
    gradients, in the memory of one chunk. No parameters (nothing in a task's state dict)."""

    def __init__(self, loss: ContrastiveLoss, chunk: int):
        super().__init__()
        if chunk < 1:
            raise ValueError(f"GradCache: chunk must be >= 1, got {chunk}")
        self.loss, self.chunk = loss, chunk

    def forward(self, encode_queries: Encode, encode_documents: Encode, batch: dict[str, Any]) -> torch.Tensor:
        documents = self.loss.documents(batch)  # first, as the loss itself does (a random subset)
        queries = self.loss.queries(batch)
        return grad_cache(lambda q, d: self.loss.objective(q, d, batch, documents),
                          [(encode_queries, queries.split(self.chunk)), (encode_documents, documents.split(self.chunk))])
