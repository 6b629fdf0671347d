"""``catalog-pairs`` (a catalog's self-supervised pairs as a dataset) and the adaptation recipe that trains
on it (configs/adapt_catalog.yaml, benchmarks/general.py lodo --adapt)."""

import json
from pathlib import Path

import pytest
from conftest import load_benchmark

from toolgraph.data.loading import load_dataset
from toolgraph.errors import ConfigError, DataError

ROOT = Path(__file__).resolve().parents[1]


def test_pairs_come_from_the_tools_text_alone(synthetic_dataset_dir):
    ds = load_dataset("catalog-pairs", dataset=str(synthetic_dataset_dir))
    catalog = load_dataset(str(synthetic_dataset_dir))
    views = {t.id: t for t in ds.tools}
    assert {q.split for q in ds.queries} == {"train", "val"}
    assert sum(q.split == "val" for q in ds.queries) == pytest.approx(0.1 * len(ds.queries), abs=3)
    kinds = {q.id.split("::")[0] for q in ds.queries}
    assert kinds == {"ict", "name"}  # the synthetic tools have no parameters: no params pairs
    assert len(ds.queries) == 2 * len(catalog.tools)
    requests = {q.text for q in catalog.queries}
    for q in ds.queries:
        (gold,) = q.tools
        assert gold.split("::")[0] == q.id.split("::")[0]
        assert q.text not in requests  # no labelled query is read
        assert q.text.lower() not in views[gold].document().lower()  # taken out of the tool it is matched to
    assert ds.notes["catalog_tools"] == len(catalog.tools)


def test_kinds_and_sample_size(synthetic_dataset_dir):
    ds = load_dataset("catalog-pairs", dataset=str(synthetic_dataset_dir), kinds=["name"], max_tools=5, seed=3)
    assert len(ds.queries) == 5 and all(q.id.startswith("name::") for q in ds.queries)
    again = load_dataset("catalog-pairs", dataset=str(synthetic_dataset_dir), kinds=["name", "name"], max_tools=5,
                         seed=3)  # a kind named twice: its pairs once
    assert [q.text for q in again.queries] == [q.text for q in ds.queries]


@pytest.mark.parametrize("options, match", [
    ({}, "data.options.dataset"),
    ({"kinds": ["bogus"]}, "data.options.kinds"),
    ({"kinds": []}, "data.options.kinds"),
    ({"kinds": [["ict"]]}, "data.options.kinds"),
    ({"max_tools": 0}, "data.options.max_tools"),
    ({"val_fraction": 1.0}, "data.options.val_fraction"),
])
def test_bad_options_name_the_key(synthetic_dataset_dir, options, match):
    options = {"dataset": str(synthetic_dataset_dir), **options} if options else {}
    with pytest.raises(ConfigError, match=match):
        load_dataset("catalog-pairs", **options)


def test_a_catalog_without_text_to_pair_is_named(tmp_path):
    (tmp_path / "tools.jsonl").write_text(json.dumps({"id": "t1", "name": "ping", "description": "ping"}) + "\n")
    (tmp_path / "queries.jsonl").write_text("")
    with pytest.raises(DataError, match=str(tmp_path)):
        load_dataset("catalog-pairs", dataset=str(tmp_path))


def _overrides(catalog: Path, encoder: Path) -> list[str]:
    return [f"data.options.dataset={catalog}", f"model.encoder.name={encoder}", "model.freeze_layers=1",
            "data.batch_size=8", "data.max_query_length=24", "data.max_tool_length=24", "trainer.max_steps=6",
            "trainer.val_check_interval=6", "trainer.accelerator=cpu", "trainer.devices=1",
            "trainer.enable_progress_bar=false", "logger.wandb=false", "model.cache_dir=null"]


def test_adaptation_trains_the_top_layers_of_the_given_encoder(synthetic_dataset_dir, tiny_bert_dir, tmp_path,
                                                               monkeypatch):
    """lodo --adapt: the encoder it is given trains on the catalog's pairs (its frozen bottom unchanged),
    is exported as trained, and a finished folder is read again, not retrained."""
    import torch
    from transformers import AutoModel

    general = load_benchmark("general", monkeypatch)
    out = tmp_path / "adapt"
    done = general.adapt(tiny_bert_dir, str(synthetic_dataset_dir), out, str(ROOT / "configs/adapt_catalog.yaml"),
                         _overrides(synthetic_dataset_dir, tiny_bert_dir)[2:])
    assert done["training"]["steps"] == 6
    before = AutoModel.from_pretrained(tiny_bert_dir).state_dict()
    after = AutoModel.from_pretrained(out / "retriever" / "encoder").state_dict()
    frozen = [k for k in before if k.startswith(("embeddings.", "encoder.layer.0."))]
    trained = [k for k in before if k.startswith("encoder.layer.1.")]
    assert frozen and trained
    assert all(torch.equal(before[k], after[k]) for k in frozen)
    assert any(not torch.equal(before[k], after[k]) for k in trained)
    stamp = (out / "results.json").stat().st_mtime_ns
    general.adapt(tiny_bert_dir, str(synthetic_dataset_dir), out, str(ROOT / "configs/adapt_catalog.yaml"),
                  _overrides(synthetic_dataset_dir, tiny_bert_dir)[2:])
    assert (out / "results.json").stat().st_mtime_ns == stamp


def test_an_mcp_catalog_gives_pairs_of_every_kind():
    servers = ROOT / "examples" / "servers.json"
    ds = load_dataset("catalog-pairs", dataset="mcp", catalog_options={"servers": str(servers)})
    assert {q.id.split("::")[0] for q in ds.queries} == {"ict", "name", "params"}
    assert ds.notes["catalog_tools"] == len(load_dataset("mcp", servers=str(servers)).tools)
    with pytest.raises(ConfigError, match="data.options.catalog_options"):
        load_dataset("catalog-pairs", dataset="mcp", catalog_options=["servers"])
