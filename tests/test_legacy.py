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


def _train_config(name: str):
    from toolgraph.config import config_from_dict

    return config_from_dict(json.loads((KEYS / "train_configs.json").read_text())[name])


def test_old_checkpoint_configs_of_every_task_read_their_encoder_keys_as_specs():
    from toolgraph.config import TextEncoderSpec as Spec
    from toolgraph.config import config_from_dict, to_saved
    from toolgraph.tasks.refiner import VectorsSpec
    from toolgraph.tasks.rerank import FirstStageSpec

    m = {name: _train_config(name).model for name in json.loads((KEYS / "train_configs.json").read_text())}
    assert m["bi_encoder"].encoder == Spec(name="enc-a", pooling="cls", normalize=False, query_prefix="query: ",
                                           doc_prefix="tool: ")
    assert m["bi_encoder"].states_dir == "acts"  # model.cache_dir was its activation cache
    assert (m["tool2vec"].encoder.query_prefix, m["tool2vec"].encoder.doc_prefix, m["tool2vec"].usage_weight) == \
        ("q: ", "", 0.5)
    assert m["mlc"].encoder == Spec(name="enc-b", pooling="cls", normalize=False) and m["mlc"].states_dir == "acts"
    assert m["refiner"].encoder.name == "enc-c" and m["refiner"].states_dir == "acts"
    assert m["refiner"].first_stage == FirstStageSpec("runs/mlc", Spec(name="enc-x", cache_dir=None))
    assert m["refiner"].vectors == VectorsSpec("description", Spec(name="enc-v", cache_dir=None))  # one cache, both
    assert m["cross_encoder"].first_stage == FirstStageSpec("tool2vec", Spec(name="enc-x", cache_dir="emb"))
    assert m["cross_encoder"].max_pair_length == 100
    assert m["graph"].encoder == Spec(name="enc-g", cache_dir=None)
    assert m["discriminator"].encoder == Spec(name="enc-d")
    assert m["discriminator_schema"].encoder == Spec(name="enc-s", max_length=64, cache_dir=None)
    for name, model in m.items():  # saved again: the new keys only, and they read back the same
        saved = to_saved(_train_config(name))
        assert not {"pooling", "normalize", "query_prefix", "tool_prefix", "cache_dir", "first_stage_encoder",
                    "vector_encoder", "embed_max_length"} & set(saved["model"]), name
        assert config_from_dict(saved).model == model


def test_an_old_first_stage_by_name_builds_the_same_dense_retriever():
    from toolgraph.retrieval.dense import DenseRetriever
    from toolgraph.tasks.rerank import first_stage_spec

    m = _train_config("refiner_by_name").model
    old = {"name": "dense", "model": "enc-x", "tool_text": "default", "cache_dir": "emb"}  # what 48d5b50 built it from
    assert DenseRetriever.parse_config(first_stage_spec(m)) == DenseRetriever.parse_config(old)
    assert m.vectors.encoder == DenseRetriever.parse_config({"model": "enc-v", "cache_dir": "emb"}).encoder
