"""Saved tensors read into private memory, never left memory-mapped.

``safetensors.torch.load_file`` and transformers' ``from_pretrained`` map the file into memory and
keep it mapped: when the file is later cut or rewritten in place (``cp``, ``rsync --inplace``)
while a long-running process still uses the tensors, that process dies with SIGBUS. Everything
toolgraph loads from a folder someone may rewrite goes through here: the bytes are read once, and
the tensors own their memory. A file cut short or damaged is a ``DataError`` naming it, and so is
a float tensor holding NaN or inf: ``torch.topk`` ranks NaN first, so one such vector would be
every query's top hit (a model that diverged before it was saved).

    tensors = read_tensors(folder / "tool_vectors.safetensors")   # {name: tensor}, in RAM
    own_memory(model)                                               # parameters and buffers copied
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import torch
from torch import nn

from toolgraph.errors import DataError

__all__ = ["all_finite", "check_finite", "check_width", "own_memory", "read_matrix", "read_tensors", "tensor_header"]

_FIX = "the file is damaged or was cut short: re-save or re-export it"


def read_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` of a safetensors file, read into memory (no mapping stays open)."""
    from safetensors.torch import load

    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DataError("missing: the saved folder is incomplete; re-save or re-export it", path) from None
    except OSError as e:
        raise DataError(f"cannot read ({e.strerror or type(e).__name__})", path) from None
    try:
        tensors = load(data)
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types for every malformed header
        raise DataError(f"not a valid safetensors file ({type(e).__name__}: {str(e)[:200]}); {_FIX}", path) from None
    for name, t in tensors.items():
        check_finite(t, name, path)
    return tensors


def all_finite(t: torch.Tensor) -> bool:
    """Whether ``t`` holds no NaN or inf. One sum first: NaN and inf make it non-finite (30x cheaper
    than ``isfinite``); only then, or when finite values overflow it, is every element looked at."""
    return not t.is_floating_point() or bool(t.sum().isfinite()) or bool(torch.isfinite(t).all())


def check_finite(t: torch.Tensor, name: str, path: str | Path) -> None:
    """A DataError naming ``path`` and the first bad row if the float tensor ``t`` holds NaN or inf
    (integer tensors cannot)."""
    if all_finite(t):
        return
    bad = ~torch.isfinite(t)
    first = bad.reshape(t.shape[0], -1).any(1).nonzero()[0].item() if t.dim() else 0
    raise DataError(f"{name} holds {int(bad.sum())} NaN or infinite values (first in row {first}): the model or "
                    "vectors had diverged when they were saved, and torch ranks NaN first; retrain or re-index, "
                    "then re-save", path)


def read_matrix(path: str | Path, key: str, rows: int, what: str,
                tensors: dict[str, torch.Tensor] | None = None, width: int | None = None,
                width_of: str = "") -> torch.Tensor:
    """The [rows, D] float32 tensor ``key`` of a saved safetensors file (e.g. one vector per tool),
    read into memory (or taken from ``tensors``, the file already read). A missing key, another row
    count, a width other than ``width`` (when given: the encoder's, or the file's other tensors'),
    a tensor that is not floating point or not finite is a DataError naming the file; float16 /
    bfloat16 / float64 vectors are converted to float32, the dtype every query vector has."""
    tensors = read_tensors(path) if tensors is None else tensors
    if key not in tensors:
        raise DataError(f"no tensor {key!r} (it has {sorted(tensors)[:5]}); re-save the retriever", path)
    t = tensors[key]
    if t.dim() != 2 or t.shape[0] != rows:
        got = t.shape[0] if t.dim() else 0
        raise DataError(f"{key} has {got} rows (shape {list(t.shape)}) for {rows} {what}: the vectors and the "
                        f"{what} come from different saves or the file was cut; re-save the retriever", path)
    if not t.is_floating_point():
        raise DataError(f"{key} is {str(t.dtype).removeprefix('torch.')}; expected float32 vectors (any float "
                        "dtype is read): the file was not written by toolgraph; re-save the retriever", path)
    check_width(t, key, width, path, width_of)
    return t.float()  # read_tensors checked that it is finite


def check_width(t: torch.Tensor, key: str, width: int | None, path: str | Path, of: str = "") -> None:
    """A DataError unless the rows of the [n, D] tensor ``t`` are ``width`` wide (None, or no rows: not
    checked; an empty tensor is saved as [0, 0])."""
    if width is not None and t.shape[0] and t.shape[-1] != width:
        raise DataError(f"{key} vectors are {t.shape[-1]} wide, but {of or 'the other vectors'} are {width}: they "
                        "come from another model or save; re-index with this model and re-save", path)


def tensor_header(path: str | Path) -> dict[str, dict[str, Any]]:
    """``{name: {"dtype", "shape"}}`` from a safetensors header, without reading the data."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100_000_000:
                raise ValueError(f"header of {n} bytes")
            header = json.loads(f.read(n))
        return {k: {"dtype": v["dtype"], "shape": list(v["shape"])}
                for k, v in header.items() if k != "__metadata__"}
    except FileNotFoundError:
        raise DataError("missing: the saved folder is incomplete; re-save or re-export it", path) from None
    except (OSError, ValueError, TypeError, KeyError, AttributeError, struct.error) as e:
        raise DataError(f"not a valid safetensors header ({type(e).__name__}); {_FIX}", path) from None


def own_memory(module: nn.Module) -> nn.Module:
    """Copy every parameter and buffer of ``module`` into memory it owns (tied weights stay tied),
    so that no tensor is backed by a memory-mapped file any more."""
    copies: dict[int, Any] = {}
    with torch.no_grad():
        for m in module.modules():
            for name, p in list(m._parameters.items()):
                if p is not None:
                    if id(p) not in copies:
                        copies[id(p)] = nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
                    m._parameters[name] = copies[id(p)]
            for name, b in list(m._buffers.items()):
                if b is not None:
                    if id(b) not in copies:
                        copies[id(b)] = b.detach().clone()
                    m._buffers[name] = copies[id(b)]
    return module
