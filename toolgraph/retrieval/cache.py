"""On-disk embedding cache keyed by (model fingerprint, text hash).

Re-evaluating a frozen encoder re-uses every vector it has seen; a changed model (new weights or
pooling) has a new fingerprint and so a fresh cache, and a text truncated at another length has
another key. One folder per fingerprint,
one ``safetensors`` shard per flush, loaded lazily. ``folder=None`` keeps vectors in memory only.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from toolgraph.nn.storage import read_tensors


def text_key(text: str, max_length: int) -> str:
    return hashlib.sha1(f"{max_length}\x00{text}".encode()).hexdigest()


class EmbeddingCache:
    def __init__(self, folder: str | Path | None, fingerprint: str):
        self.folder = Path(folder) / fingerprint if folder is not None else None
        self._rows: dict[str, torch.Tensor] = {}
        self._new: dict[str, torch.Tensor] = {}
        self._loaded = False

    def _load(self) -> None:
        if self._loaded or self.folder is None:
            return
        self._loaded = True
        for shard in sorted(self.folder.glob("shard-*.safetensors")):
            keys = json.loads(shard.with_suffix(".json").read_text())
            vectors = read_tensors(shard)["vectors"]  # in memory: a shard rewritten later cannot crash us
            self._rows.update(zip(keys, vectors, strict=True))

    def get(self, texts: list[str], max_length: int) -> tuple[dict[int, torch.Tensor], list[int]]:
        """(found: position -> vector, positions still to encode)."""
        self._load()
        found, missing = {}, []
        for i, t in enumerate(texts):
            v = self._rows.get(text_key(t, max_length))
            if v is None:
                missing.append(i)
            else:
                found[i] = v
        return found, missing

    def put(self, texts: list[str], vectors: torch.Tensor, max_length: int) -> None:
        for t, v in zip(texts, vectors, strict=True):
            k = text_key(t, max_length)
            self._rows[k] = self._new[k] = v

    def flush(self) -> None:
        if not self._new or self.folder is None:
            self._new.clear()
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        n = len(list(self.folder.glob("shard-*.safetensors")))
        path = self.folder / f"shard-{n:05d}-{os.getpid()}.safetensors"
        keys = list(self._new)
        tmp = path.with_name(path.name + ".tmp")
        save_file({"vectors": torch.stack([self._new[k] for k in keys]).contiguous()}, str(tmp))
        path.with_suffix(".json").write_text(json.dumps(keys))
        tmp.replace(path)  # the shard appears only once complete
        self._new.clear()
