"""Model cards (toolgraph/cards.py): the README.md of every exported retriever folder."""

import json

import pytest
import yaml

import toolgraph
from toolgraph.cards import base_models, render_card, write_cards


def front_matter(path):
    text = path.read_text(encoding="utf-8")
    assert text.startswith("---\n"), path
    head, _, body = text[4:].partition("\n---\n")
    return yaml.safe_load(head), body


def test_base_models_follow_warm_starts_to_a_named_model(tmp_path):
    a, b = tmp_path / "run_a", tmp_path / "run_b"
    for run, encoder in ((a, "all-MiniLM-L6-v2"), (b, str(a / "retriever" / "encoder"))):
        (run / "retriever" / "encoder").mkdir(parents=True)
        (run / "config.yaml").write_text(yaml.safe_dump({"model": {"name": "mlc", "encoder": encoder}}))
    chain = base_models(str(b / "retriever" / "encoder"))
    assert chain == [str(b / "retriever" / "encoder"), str(a / "retriever" / "encoder"), "all-MiniLM-L6-v2"]
    meta, body = front_matter(write_cards(b / "retriever", {"config": json.loads(json.dumps(
        {"model": {"name": "refiner", "encoder": chain[0]}, "data": {"name": "toollens"}}))})[0])
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2" and meta["license"] == "apache-2.0"
    assert "model-index" not in meta and "Not evaluated" in body  # no metrics given: none claimed
    assert base_models(str(tmp_path / "elsewhere")) == [str(tmp_path / "elsewhere")]  # not a run's folder: stops


def test_card_metrics_are_the_results_and_the_table_matches(tmp_path):
    results = {"config": {"model": {"name": "bi_encoder", "encoder": "all-MiniLM-L6-v2"},
                          "data": {"name": "metatool", "test_split": "test"}},
               "metrics": {"recall@5": 0.912345, "ndcg@5": 0.8, "recall@7": 0.95, "precision@5": 0.3, "mrr": 0.7},
               "dataset": {"tools": 199, "queries": {"train": 100}},
               "training": {"steps": 12, "train_seconds": 3.5, "device": "cpu"}}
    text = render_card(results, "my_run")
    meta = yaml.safe_load(text.split("---\n")[1])
    got = {m["type"]: m["value"] for m in meta["model-index"][0]["results"][0]["metrics"]}
    assert got == {"recall_at_5": 0.9123, "ndcg_at_5": 0.8, "mrr": 0.7}  # headline metrics only, 4 decimals
    assert meta["model-index"][0]["results"][0]["dataset"] == {"name": "metatool", "type": "metatool", "split": "test"}
    assert "| Recall | 0.9123 |" in text and "| MRR | 0.7000 |" in text and "- steps: 12" in text
    assert "(199 tools, 100 training queries)" in text


def test_a_training_run_exports_cards_that_state_its_own_numbers(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    """train.py writes README.md in retriever/ and retriever/encoder/ with the metrics of its
    results.json; the folder still loads (the manifest ignores the card); `toolgraph export` writes
    a card too, without metrics it did not measure."""
    from conftest import tiny_train_overrides

    from toolgraph.cli import main
    from toolgraph.config import load_config
    from toolgraph.training import TrainConfig, train

    out = tmp_path / "run"
    summary = train(load_config(TrainConfig, [], tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, out,
                                                                       steps=8)))
    results = json.loads((out / "results.json").read_text())
    meta, body = front_matter(out / "retriever" / "README.md")
    entries = meta["model-index"][0]["results"][0]["metrics"]
    assert {"recall_at_5", "ndcg_at_5", "mrr"} <= {m["type"] for m in entries}
    for m in entries:  # each value is the results.json one
        key = m["type"].replace("_at_", "@")
        assert m["value"] == round(results["metrics"][key], 4), key
    assert meta["base_model"] == str(tiny_bert_dir) and meta["license"] == "other"  # an unnamed local model
    assert meta["datasets"] == [results["config"]["data"]["name"]] and meta["library_name"] == "toolgraph"
    assert f"- steps: {results['training']['steps']}" in body
    enc_meta, enc_body = front_matter(out / "retriever" / "encoder" / "README.md")
    assert enc_meta["pipeline_tag"] == "sentence-similarity" and "SentenceTransformer(" in enc_body
    assert enc_meta["model-index"] == [{**meta["model-index"][0], "name": "run-encoder"}]
    assert toolgraph.load(out / "retriever").retrieve(["please tell me the weather"], 3).ids  # manifest still holds
    assert main(["export", "--checkpoint", summary["best_checkpoint"], "--out", str(tmp_path / "exp")]) == 0
    exp_meta, exp_body = front_matter(tmp_path / "exp" / "README.md")
    assert "model-index" not in exp_meta and "Not evaluated" in exp_body and exp_meta["tags"][-1] == "bi_encoder"
    with pytest.raises(AssertionError):  # the parser above rejects a file without front matter
        (tmp_path / "plain.md").write_text("# no front matter\n")
        front_matter(tmp_path / "plain.md")
