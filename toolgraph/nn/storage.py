"""Saved tensors read into private memory, never left memory-mapped.

``safetensors.torch.load_file`` and transformers' ``from_pretrained`` map the file into memory and
keep it mapped: when the file is later cut or rewritten in place (``cp``, ``rsync --inplace``)
while a long-running process still uses the tensors, that process dies with SIGBUS. Everything
toolgraph loads from a folder someone may rewrite goes through here: the bytes are read once, and
the tensors own their memory. A file cut short or damaged is a ``DataError`` naming it.

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

__all__ = ["own_memory", "read_matrix", "read_tensors", "tensor_header"]

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
        return load(data)
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types for every malformed header
        raise DataError(f"not a valid safetensors file ({type(e).__name__}: {str(e)[:200]}); {_FIX}", path) from None


def read_matrix(path: str | Path, key: str, rows: int, what: str,
                tensors: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """The [rows, D] tensor ``key`` of a saved safetensors file (e.g. one vector per tool), read into
    memory (or taken from ``tensors``, the file already read); a missing key or another row count
    is a DataError naming the file and both counts."""
    tensors = read_tensors(path) if tensors is None else tensors
    if key not in tensors:
        raise DataError(f"no tensor {key!r} (it has {sorted(tensors)[:5]}); re-save the retriever", path)
    t = tensors[key]
    if t.dim() != 2 or t.shape[0] != rows:
        got = t.shape[0] if t.dim() else 0
        raise DataError(f"{key} has {got} rows (shape {list(t.shape)}) for {rows} {what}: the vectors and the "
                        f"{what} come from different saves or the file was cut; re-save the retriever", path)
    return t


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
