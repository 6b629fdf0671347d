"""``manifest.json``: what a saved retriever folder holds, checked before it is loaded.

``Retriever.save`` writes it last: every file under the folder (path relative to it, size and
sha256; sub-folders included, so an exported ``encoder/`` and a pipeline's members are covered),
the shape and dtype of each tensor of its safetensors files, the number of tools, and for each
text-encoder folder its tokenizer's vocabulary size and the model's embedding rows. While a save is
running the file says ``{"status": "writing"}``, so a save that was interrupted is refused rather
than half-loaded. ``Retriever.load`` / ``toolgraph.load`` check it first and raise a ``DataError``
naming the file and the mismatch (changed bytes, missing file, another tool count). Files that
are not listed (a README put beside the index, hidden files) are ignored. A folder written before
manifests existed has none and loads without the check.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import suppress
from pathlib import Path, PurePosixPath
from typing import Any

from toolgraph.errors import DataError
from toolgraph.files import write_text_atomic

__all__ = ["DELTA_FILES", "MANIFEST", "add_to_manifest", "check_manifest", "mark_writing", "write_manifest"]

MANIFEST = "manifest.json"
# written only by index sync's delta write (retrieval/delta.py, delta_sync.py), never by a save
DELTA_FILES = ("delta.json", "delta.jsonl", "delta.safetensors", "sync-state.json")
FORMAT = 1
_RESAVE = "re-save the retriever (or copy the whole folder again)"


# the tensor and tokenizer readers come from nn (torch, transformers): imported where used, so that
# loading a config that builds a BM25 retriever does not import them
def _tensor_header(path: Path) -> Any:
    from toolgraph.nn.storage import tensor_header

    return tensor_header(path)


def _count_vocabulary(folder: Path) -> int | None:
    from toolgraph.nn.encoder import count_vocabulary

    return count_vocabulary(folder)


def _write(folder: Path, data: dict[str, Any]) -> None:
    """``manifest.json`` replaced in one rename: readers see the old file or the new one."""
    write_text_atomic(folder / MANIFEST, json.dumps(data, indent=1, sort_keys=True) + "\n")


def mark_writing(folder: str | Path) -> None:
    """Mark ``folder`` as being saved: until ``write_manifest`` ends the save, loading refuses it. A
    delta and sync state that the folder's manifest lists (retrieval/delta.py) describe the save being
    replaced, so they go first; files the manifest does not list are someone else's and stay."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with suppress(OSError, ValueError, UnicodeDecodeError, AttributeError, TypeError):
        listed = json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("files") or {}
        for name in DELTA_FILES:
            if name in listed and (folder / name).is_file():
                os.unlink(folder / name)
    _write(folder, {"format": FORMAT, "status": "writing"})


def _files(folder: Path) -> list[Path]:
    """Every regular file under ``folder``, sorted; hidden names and the manifest itself left out."""
    out = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for n in sorted(names):
            p = Path(root) / n
            if not n.startswith(".") and p != folder / MANIFEST and p.is_file():
                out.append(p)
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _encoder_rows(folder: Path) -> int | None:
    """The embedding rows of a Hugging Face model folder (``config.json`` with a ``model_type``)."""
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        return None
    rows = cfg.get("vocab_size")
    return rows if isinstance(rows, int) else None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def write_manifest(folder: str | Path, retriever: str, tools: int, linked_from: str | Path | None = None) -> Path:
    """Describe every file of the saved ``folder``; written last, so it also marks the save complete.
    ``linked_from``: a saved folder some of these files are hard links of (index sync's delta write):
    a file that is the very file (same inode) listed there keeps that entry instead of being hashed."""
    folder = Path(folder)
    files: dict[str, dict[str, Any]] = {}
    tensors: dict[str, Any] = {}
    encoders: dict[str, Any] = {}
    old: dict[str, Any] = {}
    if linked_from is not None:
        with suppress(OSError, ValueError, UnicodeDecodeError):
            old = json.loads((Path(linked_from) / MANIFEST).read_text(encoding="utf-8"))
        old = old if isinstance(old, dict) and isinstance(old.get("files"), dict) else {"files": {}}
    for p in _files(folder):
        rel = p.relative_to(folder).as_posix()
        entry = old["files"].get(rel) if old else None
        linked = entry is not None and _same_file(p, Path(linked_from) / rel) and entry.get("size") == p.stat().st_size
        files[rel] = dict(entry) if linked else {"size": p.stat().st_size, "sha256": _sha256(p)}
        if p.suffix == ".safetensors":
            tensors[rel] = (old.get("tensors") or {}).get(rel) if linked else None
            tensors[rel] = tensors[rel] or _tensor_header(p)
        if p.name == "config.json" and (rows := _encoder_rows(p.parent)) is not None:
            encoders[p.parent.relative_to(folder).as_posix()] = {"vocab_size": _count_vocabulary(p.parent),
                                                                 "embedding_rows": rows}
    _write(folder, {"format": FORMAT, "retriever": retriever, "tools": tools, "files": files,
                    "tensors": tensors, "encoders": encoders})
    return folder / MANIFEST


def add_to_manifest(folder: str | Path, names: list[str]) -> None:
    """List the files ``names`` (written into a saved ``folder`` after its save) in its manifest, the
    other entries kept as they are (no file hashed again)."""
    folder = Path(folder)
    m = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    for name in names:
        m["files"][name] = {"size": (folder / name).stat().st_size, "sha256": _sha256(folder / name)}
    _write(folder, m)


def _relative(name: Any, manifest: Path) -> str:
    """A listed path, refused unless it stays inside the folder (no absolute path, no ``..``)."""
    if (not isinstance(name, str) or not name or "\\" in name or "\0" in name
            or PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts):
        raise DataError(f"lists {name!r}, which is not a path inside the folder; the manifest is damaged: "
                        f"{_RESAVE}", manifest)
    return name


def _entry(obj: Any, keys: tuple[str, ...], where: str, manifest: Path) -> dict[str, Any]:
    if not isinstance(obj, dict) or any(k not in obj for k in keys):
        raise DataError(f"{where}: expected an object with {', '.join(keys)}; the manifest is damaged: {_RESAVE}",
                        manifest)
    return obj


def check_manifest(folder: str | Path) -> dict[str, Any] | None:
    """Check ``folder`` against its ``manifest.json``; the manifest, or None for a folder saved
    before manifests existed. Any difference is a DataError naming the file."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise DataError(f"not readable ({type(e).__name__}); the folder is damaged: {_RESAVE}", path) from None
    if not isinstance(m, dict):
        raise DataError(f"expected a JSON object; the folder is damaged: {_RESAVE}", path)
    if m.get("status") == "writing":
        raise DataError("the save into this folder did not finish (manifest.json still says it is being "
                        f"written): {_RESAVE}", folder)
    if not isinstance(m.get("format"), int) or m["format"] > FORMAT:
        raise DataError(f"manifest format {m.get('format')!r} is not one this toolgraph reads (<= {FORMAT}): "
                        "upgrade toolgraph or re-save the retriever with this version", path)
    files = m.get("files")
    if not isinstance(files, dict) or not isinstance(m.get("tools"), int):
        raise DataError(f"no 'files' or 'tools' entry; the manifest is damaged: {_RESAVE}", path)
    for key in ("tensors", "encoders"):
        if not isinstance(m.get(key) or {}, dict):
            raise DataError(f"'{key}' is not an object; the manifest is damaged: {_RESAVE}", path)
    for name, info in files.items():
        rel = _relative(name, path)
        info = _entry(info, ("size", "sha256"), rel, path)
        p = folder / rel
        if not p.is_file():
            raise DataError(f"missing: {MANIFEST} lists it ({info['size']} bytes) but the folder has no such "
                            f"file; the folder is incomplete: {_RESAVE}", p)
        size = p.stat().st_size
        if size != info["size"]:
            raise DataError(f"{size} bytes, but {MANIFEST} says {info['size']}: the file was changed or cut "
                            f"short after the save; {_RESAVE}", p)
        digest = _sha256(p)
        if digest != info["sha256"]:
            raise DataError(f"its content differs from {MANIFEST} (sha256 {digest[:12]}..., expected "
                            f"{str(info['sha256'])[:12]}...): the file was changed after the save; {_RESAVE}", p)
    for name, expected in (m.get("tensors") or {}).items():
        p = folder / _relative(name, path)
        got = _tensor_header(p)
        want = expected if isinstance(expected, dict) else {}
        if got != want:
            diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
            detail = ", ".join(f"{k}: {got.get(k)} (manifest: {want.get(k)})" for k in diff[:3])
            raise DataError(f"tensors differ from {MANIFEST}: {detail}; {_RESAVE}", p)
    for name, info in (m.get("encoders") or {}).items():
        d = folder / _relative(name, path)
        info = _entry(info, ("vocab_size", "embedding_rows"), name, path)
        from toolgraph.nn.encoder import check_encoder_folder

        check_encoder_folder(d)
        got = _count_vocabulary(d)
        if got != info["vocab_size"]:
            raise DataError(f"the tokenizer has {got} tokens, {MANIFEST} says {info['vocab_size']}: the "
                            f"tokenizer files were changed after the save; {_RESAVE}", d)
    return m
