"""Streaming, resumable encoding of a large catalog: fixed-size chunks, each written atomically.

    vectors = encode_in_chunks(texts, encode, folder, fingerprint)   # [N, H]

Chunk ``i`` holds the vectors of ``texts[i*size:(i+1)*size]`` in ``folder/chunk-<i>.safetensors``,
with the sha256 of those texts and the encoder's fingerprint in its header. A chunk is written to a
temp file and renamed, so it is complete or absent; a run killed at any point resumes where it
stopped: a chunk whose header matches is read, not encoded again (a chunk of other texts or another
encoder is encoded again and replaced). Only one chunk's vectors are being encoded at a time; the
bar's ETA counts the remaining chunks only.

Several processes (``torchrun`` ranks, or ``RANK``/``WORLD_SIZE`` set by any launcher, on one machine
or sharing the folder) split the chunks: rank r encodes chunks r, r+world, ...; rank 0 then waits for
the others' files and, if none has appeared for ``patience`` seconds (a rank died), encodes what is
missing itself. No process group is needed: the folder is the rendezvous.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from toolgraph.retrieval.progress import progress_enabled

CHUNK = 8192  # texts per chunk: ~2 minutes of MiniLM on 2 CPU cores, 12 MB of vectors


def rank_and_world() -> tuple[int, int]:
    """This process's (rank, world size) from the launcher's ``RANK`` / ``WORLD_SIZE`` (torchrun sets
    them); (0, 1) when unset."""
    try:
        return int(os.environ.get("RANK", "0")), max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 0, 1


def texts_digest(texts: list[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode())
        h.update(b"\x00")
    return h.hexdigest()


def _path(folder: Path, i: int) -> Path:
    return folder / f"chunk-{i:06d}.safetensors"


def _read(path: Path, digest: str, fingerprint: str) -> torch.Tensor | None:
    """The chunk's vectors if the file is one of these texts by this encoder, else None."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("texts") != digest or meta.get("encoder") != fingerprint:
                return None
            return f.get_tensor("vectors")
    except (OSError, RuntimeError, ValueError):  # absent, or a foreign / damaged file: encode it again
        return None


def _write(path: Path, vectors: torch.Tensor, digest: str, fingerprint: str, seconds: float) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    save_file({"vectors": vectors.contiguous()}, str(tmp),
              metadata={"texts": digest, "encoder": fingerprint, "seconds": f"{seconds:.3f}"})
    tmp.replace(path)


def chunk_seconds(folder: str | Path) -> float:
    """The encoding seconds recorded in the chunks of ``folder`` (summed over ranks)."""
    total = 0.0
    for path in sorted(Path(folder).glob("chunk-*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            total += float((f.metadata() or {}).get("seconds", 0))
    return total


def encode_in_chunks(texts: list[str], encode: Callable[[list[str]], torch.Tensor], folder: str | Path,
                     fingerprint: str, size: int = CHUNK, rank: int | None = None, world: int | None = None,
                     progress: bool | str = "encoding", patience: float = 600.0) -> torch.Tensor | None:
    """texts -> [N, H] through ``folder`` (see the module doc). ``encode``: a list of texts -> their
    vectors; ``fingerprint``: the encoder's (a chunk by another is not reused). On a rank other than
    0 the return is None once its own chunks are written."""
    if rank is None or world is None:
        rank, world = rank_and_world()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    n_chunks = -(-len(texts) // size)
    parts = [texts[i * size:(i + 1) * size] for i in range(n_chunks)]
    digests = [texts_digest(p) for p in parts]
    done: dict[int, torch.Tensor] = {}
    mine = [i for i in range(n_chunks) if i % world == rank]
    for i in mine:
        v = _read(_path(folder, i), digests[i], fingerprint)
        if v is not None:
            done[i] = v
    label = progress if isinstance(progress, str) else "encoding"
    bar = tqdm(total=len(texts), initial=sum(len(parts[i]) for i in done), desc=label, unit="text",
               disable=not progress_enabled(bool(progress)))
    try:
        def run(i: int) -> None:
            start = time.perf_counter()
            v = encode(parts[i]).float()
            _write(_path(folder, i), v, digests[i], fingerprint, time.perf_counter() - start)
            done[i] = v if rank == 0 else v[:0]  # other ranks keep nothing: rank 0 reads their files
            bar.update(len(parts[i]))

        for i in mine:
            if i not in done:
                run(i)
        if rank != 0:
            return None
        last = time.monotonic()
        while len(done) < n_chunks:  # the other ranks' chunks
            found = False
            for i in range(n_chunks):
                if i not in done and (v := _read(_path(folder, i), digests[i], fingerprint)) is not None:
                    done[i], found = v, True
                    bar.update(len(parts[i]))
            if found:
                last = time.monotonic()
            elif time.monotonic() - last > patience:  # a rank died: encode its chunks here
                for i in range(n_chunks):
                    if i not in done:
                        run(i)
            else:
                time.sleep(0.2)
    finally:
        bar.close()
    if not texts:
        return torch.zeros(0, 0)
    return torch.cat([done[i] for i in range(n_chunks)])
