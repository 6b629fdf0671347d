"""Files written by an older toolgraph (commit c89a4a5, before the layering refactor) still load
and rank exactly as they did then: a bi-encoder checkpoint, its exported folder, a BM25 folder.
The fixture is made by tests/fixtures/make_legacy.py."""

import json
import shutil
from pathlib import Path

import pytest

import toolgraph

LEGACY = Path(__file__).resolve().parent / "fixtures" / "legacy"
EXPECTED = json.loads((LEGACY / "expected.json").read_text())


@pytest.mark.parametrize("name", ["bi_encoder.ckpt", "bi_encoder_export", "bm25"])
def test_legacy_file_ranks_as_when_it_was_written(name, tmp_path):
    src = LEGACY / name
    dst = tmp_path / name  # loading may write caches beside the file: never into the fixture
    shutil.copy(src, dst) if src.is_file() else shutil.copytree(src, dst)
    ranking = toolgraph.load(dst).retrieve(EXPECTED["queries"], k=5)
    assert ranking.ids == EXPECTED[name]["ids"]
    got = [round(float(v), 6) for row in ranking.scores for v in row]
    assert got == pytest.approx([v for row in EXPECTED[name]["scores"] for v in row], abs=2e-6)


# ---- config keys renamed by issue 42 (one TextEncoderSpec per text encoder) -----------------------
# retriever.json files written with the old keys (tests/fixtures/make_legacy_keys.py, at commit 48d5b50)
KEYS = LEGACY / "keys_v1"
KEYS_EXPECTED = json.loads((KEYS / "expected.json").read_text())
OLD_KEYS = {"model", "pooling", "normalize", "max_length", "query_max_length", "query_prefix", "doc_prefix",
            "cache_dir", "max_tool_length", "max_query_length"}


def _encoders(r) -> dict:
    from toolgraph.config import to_dict

    return {"encoder": to_dict(r.config.encoder)} if hasattr(r.config, "encoder") else \
        {"dense.encoder": to_dict(r.dense.config.encoder)}


@pytest.mark.parametrize("name, encoder", [
    ("dense", {"name": "encoder", "pooling": "cls", "normalize": False, "max_length": 12, "max_query_length": 5,
               "query_prefix": "find: ", "doc_prefix": "tool: ", "cache_dir": None}),
    ("mlc", {"name": "encoder", "pooling": "mean", "normalize": False, "max_length": 10, "max_query_length": 6,
             "query_prefix": None, "doc_prefix": None, "cache_dir": None}),
    ("t2a", {"name": "encoder", "pooling": "mean", "normalize": True, "max_length": 9, "max_query_length": 4,
             "query_prefix": "q ", "doc_prefix": None, "cache_dir": None}),
    ("gnn", {"name": "tiny-encoder", "pooling": "mean", "normalize": True, "max_length": 12, "max_query_length": 5,
             "query_prefix": None, "doc_prefix": None, "cache_dir": None}),
])
def test_old_encoder_keys_load_through_the_renames_and_rank_the_same(name, encoder, tmp_path, monkeypatch):
    shutil.copytree(KEYS / name, tmp_path / name)
    shutil.copytree(LEGACY / "bi_encoder_export" / "encoder", tmp_path / "tiny-encoder")  # the gnn's encoder, by name
    monkeypatch.chdir(tmp_path)
    r = toolgraph.load(tmp_path / name)
    assert list(_encoders(r).values()) == [encoder]  # every old key landed on its new one
    for folder in (name, "again"):  # as written then, and saved again today
        ranking = toolgraph.load(tmp_path / folder).retrieve(KEYS_EXPECTED["queries"], k=5)
        assert ranking.ids == KEYS_EXPECTED[name]["ids"]
        got = [round(float(v), 6) for row in ranking.scores for v in row]
        assert got == pytest.approx([v for row in KEYS_EXPECTED[name]["scores"] for v in row], abs=2e-6)
        if folder == name:
            r.save(tmp_path / "again")
    saved = [json.loads(p.read_text())["config"] for p in sorted((tmp_path / "again").rglob("retriever.json"))]
    assert all(not OLD_KEYS & set(c) for c in saved), saved  # files written today carry the new keys only
    assert any("encoder" in c and isinstance(c["encoder"], dict) for c in saved)


def test_the_old_exported_folder_reads_its_old_keys_as_the_encoder_spec(tmp_path):
    from toolgraph.config import TextEncoderSpec

    shutil.copytree(LEGACY / "bi_encoder_export", tmp_path / "export")
    r = toolgraph.load(tmp_path / "export")
    assert r.config.encoder == TextEncoderSpec(name="encoder", max_length=16, max_query_length=128, query_prefix="",
                                               doc_prefix="", cache_dir=None)
