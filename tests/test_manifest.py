"""Issue 20, Build 2: saved retrievers and exported folders carry manifest.json (every file's size
and sha256, tensor shapes and dtypes, tool count, tokenizer vocabulary size); loading checks it
and names the file and the mismatch. Folders written before manifests load without one."""

import json
import shutil
from pathlib import Path

import pytest
from saved_retrievers import QUERIES, TOOLS, build

import toolgraph
from toolgraph.errors import DataError
from toolgraph.retrieval import Retriever
from toolgraph.retrieval.loading import resolve_retriever

LEGACY = Path(__file__).resolve().parent / "fixtures" / "legacy"


@pytest.fixture
def saved_dense(tiny_bert_dir, tmp_path) -> Path:
    """A dense retriever saved with its exported encoder under encoder/."""
    return build("dense", tiny_bert_dir).save(tmp_path / "dense")


def _bm25(tools=TOOLS):
    r = resolve_retriever({"name": "bm25"}, "r")
    r.index(tools)
    return r


def test_save_writes_a_manifest_of_every_file(saved_dense):
    m = json.loads((saved_dense / "manifest.json").read_text())
    assert m["retriever"] == "dense" and m["tools"] == len(TOOLS)
    files = set(m["files"])
    assert {"retriever.json", "tools.jsonl", "tool_vectors.safetensors", "encoder/model.safetensors",
            "encoder/tokenizer.json", "encoder/config.json"} <= files
    assert files == {p.relative_to(saved_dense).as_posix() for p in saved_dense.rglob("*")
                     if p.is_file() and p.name != "manifest.json"}
    on_disk = saved_dense / "tool_vectors.safetensors"
    assert m["files"]["tool_vectors.safetensors"]["size"] == on_disk.stat().st_size
    assert m["tensors"]["tool_vectors.safetensors"] == {"tool_vectors": {"dtype": "F32", "shape": [len(TOOLS), 32]}}
    assert m["encoders"]["encoder"] == {"vocab_size": 30522, "embedding_rows": 30522}
    assert toolgraph.load(saved_dense).retrieve(QUERIES, 3).ids  # and it loads


def test_changed_bytes_are_named(saved_dense):
    path = saved_dense / "tool_vectors.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # same size, one byte of one vector changed
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"tool_vectors\.safetensors: its content differs from manifest\.json.*re-save"):
        toolgraph.load(saved_dense)


def test_cut_file_is_named_with_both_sizes(saved_dense):
    path = saved_dense / "encoder" / "model.safetensors"
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(DataError, match=rf"encoder/model\.safetensors: {size // 2} bytes, but manifest\.json says {size}"):
        toolgraph.load(saved_dense)


def test_missing_file_is_named(saved_dense):
    (saved_dense / "encoder" / "tokenizer.json").unlink()
    with pytest.raises(DataError, match=r"encoder/tokenizer\.json: missing: manifest\.json lists it"):
        toolgraph.load(saved_dense)


def test_wrong_tool_count_is_named(tmp_path):
    folder = _bm25().save(tmp_path / "bm25")
    m = json.loads((folder / "manifest.json").read_text())
    m["tools"] = len(TOOLS) + 34  # the manifest says 40 tools, tools.jsonl holds 6
    (folder / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match=r"tools\.jsonl: 6 tools, but manifest\.json says 40"):
        toolgraph.load(folder)


def test_tools_file_cut_in_a_folder_without_manifest_is_named(tmp_path):
    """Folders saved before manifests still say their tool count in retriever.json: it is checked."""
    folder = _bm25().save(tmp_path / "bm25")
    (folder / "manifest.json").unlink()
    lines = (folder / "tools.jsonl").read_text().splitlines(keepends=True)
    (folder / "tools.jsonl").write_text("".join(lines[:-1]))
    with pytest.raises(DataError, match=r"tools\.jsonl: 5 tools, but retriever\.json says 6"):
        toolgraph.load(folder)


def test_interrupted_save_is_refused_not_half_loaded(tmp_path, monkeypatch):
    folder = tmp_path / "idx"
    r = _bm25()
    r.save(folder)  # a good index ...

    def crash(self, folder):
        raise OSError("disk full")

    monkeypatch.setattr(type(r), "_save_state", crash)
    with pytest.raises(OSError, match="disk full"):
        _bm25(TOOLS[:3]).save(folder)  # ... re-saved in place, and the save dies half-way
    monkeypatch.undo()
    with pytest.raises(DataError, match=r"idx: the save into this folder did not finish"):
        toolgraph.load(folder)
    r.save(folder)  # saving again repairs it
    assert len(toolgraph.load(folder).tools) == len(TOOLS)


def test_member_folders_are_checked_once_from_the_outer_manifest(tmp_path, monkeypatch):
    from toolgraph.retrieval import manifest as M

    fused = resolve_retriever({"name": "fusion", "members": [{"name": "bm25"}, {"name": "bm25", "k1": 0.9}]}, "r")
    fused.index(TOOLS)
    folder = fused.save(tmp_path / "fused")
    outer = json.loads((folder / "manifest.json").read_text())["files"]
    assert "member_1/manifest.json" in outer and "member_1/tools.jsonl" in outer
    hashed = []
    real = M._sha256
    monkeypatch.setattr(M, "_sha256", lambda p: (hashed.append(p), real(p))[1])
    toolgraph.load(folder)
    assert len(hashed) == len(set(hashed)) == len(outer)  # every file once, members not re-hashed
    with (folder / "member_1" / "tools.jsonl").open("a") as f:
        f.write("\n")
    with pytest.raises(DataError, match=r"member_1/tools\.jsonl: \d+ bytes, but manifest\.json says"):
        toolgraph.load(folder)


def test_manifest_paths_stay_inside_the_folder(tmp_path):
    folder = _bm25().save(tmp_path / "bm25")
    (tmp_path / "secret").write_text("x")
    m = json.loads((folder / "manifest.json").read_text())
    m["files"]["../secret"] = {"size": 1, "sha256": "0" * 64}
    (folder / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match=r"manifest\.json: lists '\.\./secret', which is not a path inside the folder"):
        toolgraph.load(folder)


@pytest.mark.parametrize("text", ["{half", "[]", '{"format": 1, "tools": 6}', '{"format": 99, "files": {}, "tools": 6}'])
def test_damaged_manifest_is_named(tmp_path, text):
    folder = _bm25().save(tmp_path / "bm25")
    (folder / "manifest.json").write_text(text)
    with pytest.raises(DataError, match=r"bm25(/manifest\.json)?: .*(damaged|format)"):
        toolgraph.load(folder)


def test_files_not_listed_are_ignored(tmp_path):
    folder = _bm25().save(tmp_path / "bm25")
    (folder / "README.md").write_text("my index\n")
    assert len(toolgraph.load(folder).tools) == len(TOOLS)


def test_folders_without_a_manifest_load_as_before(tmp_path):
    """Written before manifests existed (tests/fixtures/legacy): loaded without the check."""
    shutil.copytree(LEGACY / "bm25", tmp_path / "bm25")
    assert not (tmp_path / "bm25" / "manifest.json").exists()
    assert toolgraph.load(tmp_path / "bm25").retrieve(["weather"], 2).ids


def test_export_of_a_training_run_carries_a_manifest_covering_the_encoder(saved_dense):
    """What export_retriever writes (encoder/ first, then the retriever) is one manifest."""
    r = Retriever.load(saved_dense)
    out = saved_dense.parent / "export"
    from toolgraph.nn.export import export_sentence_transformer

    export_sentence_transformer(r.encoder, r._tokenizer, out / "encoder", 32)
    r.save(out)
    files = json.loads((out / "manifest.json").read_text())["files"]
    assert "encoder/model.safetensors" in files and "encoder/modules.json" in files
    assert toolgraph.load(out).retrieve(QUERIES, 3).ids == r.retrieve(QUERIES, 3).ids

