"""train.py end to end with a tiny random BERT: outputs, logging, checkpoints -> inference."""

import csv
import json
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_train_overrides

import toolgraph
from toolgraph.config import load_config
from toolgraph.errors import ConfigError
from toolgraph.tasks.base import lr_lambda
from toolgraph.training import TrainConfig, train


@pytest.fixture(scope="module")
def trained(synthetic_dataset_dir, tiny_bert_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cfg = load_config(TrainConfig, [], tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, out, steps=30))
    summary = train(cfg)
    return out, summary, cfg


def test_outputs_exist(trained):
    out, summary, _ = trained
    assert (out / "config.yaml").read_text().count("bi_encoder") >= 1
    assert (out / "checkpoints" / "last.ckpt").exists() and summary["best_checkpoint"].endswith(".ckpt")
    res = json.loads((out / "results.json").read_text())
    assert set(res) >= {"metrics", "config", "dataset", "timings", "training"}
    assert (out / "retriever" / "retriever.json").exists() and (out / "rankings.jsonl").exists()
    assert (out / "retriever" / "encoder" / "model.safetensors").exists()


def test_training_learns(trained):
    out, summary, _ = trained
    rows = list(csv.DictReader((out / "logs" / "metrics.csv").open()))
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert len(losses) >= 20 and sum(losses[-5:]) / 5 < sum(losses[:5]) / 5  # the loss goes down
    assert summary["metrics"]["recall@5"] > 0.5  # chance is ~0.2 on 24 tools


def test_logged_metrics_read_back(trained):
    out, _, cfg = trained
    rows = list(csv.DictReader((out / "logs" / "metrics.csv").open()))
    keys = set().union(*(r.keys() for r in rows))
    assert {"train/loss", "val/recall@3", "val/ndcg@5", "test/recall@5", "lr-AdamW/pg1"} <= keys
    hparams = (out / "logs" / "hparams.yaml").read_text()
    assert "bi_encoder" in hparams and "temperature" in hparams


def test_lightning_test_metrics_equal_exported_evaluation(trained):
    _, summary, _ = trained
    for k in ("recall@1", "recall@5", "ndcg@5", "pass@5"):
        assert summary["test"][f"test/{k}"] == pytest.approx(summary["metrics"][k], abs=1e-5)


def test_checkpoint_and_exported_folder_load_as_the_same_retriever(trained):
    out, summary, _ = trained
    queries = ["please tell me the weather", "please tell me the taxi and please tell me the map"]
    from_ckpt = toolgraph.load(summary["best_checkpoint"]).retrieve(queries, 5)
    from_dir = toolgraph.load(out / "retriever").retrieve(queries, 5)
    from_run = toolgraph.load(out).retrieve(queries, 5)
    assert from_ckpt.ids == from_dir.ids == from_run.ids
    assert torch.allclose(from_ckpt.scores, from_dir.scores, atol=1e-5)


def test_sentence_transformers_loads_export_with_same_vectors(trained):
    from sentence_transformers import SentenceTransformer

    out, _, _ = trained
    r = toolgraph.load(out / "retriever")
    st = SentenceTransformer(str(out / "retriever" / "encoder"), device="cpu")
    texts = ["please tell me the weather", "returns hotel information for the user"]
    ours = r.encode_queries(texts)
    theirs = torch.from_numpy(st.encode(texts, normalize_embeddings=False))
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_retrieve_command_prints_top_tools(trained, capsys):
    from toolgraph.cli import main

    out, _, _ = trained
    assert main(["retrieve", "--checkpoint", str(out), "-k", "3", "please tell me the weather"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# please tell me the weather") and "  1. " in printed


def test_checkpoint_is_loaded_weights_only(trained, tmp_path):
    """A checkpoint holding an arbitrary pickled object is refused, not unpickled."""
    from toolgraph.errors import DataError

    out, summary, _ = trained
    ckpt = torch.load(summary["best_checkpoint"], map_location="cpu", weights_only=True)
    ckpt["evil"] = Path("x")  # any non-allowlisted class
    bad = tmp_path / "bad.ckpt"
    torch.save(ckpt, bad)
    with pytest.raises(DataError, match="weights-only"):
        toolgraph.load(bad)


def test_lr_schedule_shapes():
    assert lr_lambda(0, 100, 10, "linear") == pytest.approx(0.1)
    assert lr_lambda(9, 100, 10, "linear") == pytest.approx(1.0)
    assert lr_lambda(55, 100, 10, "linear") == pytest.approx(0.5)
    assert lr_lambda(55, 100, 10, "cosine") == pytest.approx(0.5)
    assert lr_lambda(99, 100, 10, "constant") == 1.0
    with pytest.raises(ValueError):
        lr_lambda(50, 100, 10, "step")


def test_bad_training_config_is_clear(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    base = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path)
    with pytest.raises(ConfigError, match="model.temprature"):
        load_config(TrainConfig, [], base + ["model.temprature=0.1"])
    with pytest.raises(ConfigError, match="checkpoint.monitor"):
        train(load_config(TrainConfig, [], base + ["checkpoint.monitor=val/recall@50"]))
    with pytest.raises(ConfigError, match="unknown task 'nope'"):
        load_config(TrainConfig, [], base + ["model.name=nope"])


@pytest.mark.slow
def test_wandb_offline_run_holds_the_logged_metrics_and_config(synthetic_dataset_dir, tiny_bert_dir, tmp_path,
                                                                monkeypatch):
    """W&B through Lightning's WandbLogger, offline into a temp folder (never logs in). The run
    file is W&B's binary record log; the metric names and config keys must be in it."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    over = [o for o in tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path / "run", steps=8)
            if o != "logger.wandb=false"]
    train(load_config(TrainConfig, [], over + ["logger.wandb=true", "export=false"]))
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    keys = (b"train/loss", b"val/recall@5", b"test/recall@5", b"temperature", b"bi_encoder")
    deadline = time.monotonic() + 90  # W&B's service process may still be flushing on a loaded machine
    while True:
        blob = runs[0].read_bytes()
        if all(k in blob for k in keys) or time.monotonic() > deadline:
            break
        time.sleep(1)
    for key in keys:
        assert key in blob, key


def test_evaluate_with_checkpoint_uses_the_runs_data(trained, tmp_path, capsys):
    from toolgraph.cli import main

    out, summary, _ = trained
    assert main(["evaluate", "--checkpoint", summary["best_checkpoint"], "--out", str(tmp_path / "ev")]) == 0
    res = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert res["dataset"]["queries"]["test"] == 40
    assert res["metrics"]["recall@5"] == pytest.approx(summary["metrics"]["recall@5"], abs=1e-6)


def test_hard_negatives_from_a_saved_retriever_exclude_gold(trained, synthetic_dataset_dir):
    from toolgraph.config import TextDataConfig
    from toolgraph.data.formats import read_dataset
    from toolgraph.data.text import ToolTextDataModule
    from toolgraph.tasks.bi_encoder import mine_hard_negatives

    out, _, _ = trained
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(out / "retriever" / "encoder")
    dm = ToolTextDataModule(read_dataset(synthetic_dataset_dir), TextDataConfig(), tok)
    negs = mine_hard_negatives(dm, str(out / "retriever"), depth=5, tool_text="default")
    assert len(negs) == len(dm.train_queries)
    assert all(negs[i] and not set(negs[i]) & set(dm.train_gold[i]) and len(negs[i]) <= 5 for i in range(len(negs)))


@pytest.mark.parametrize("override,needle", [
    ("model.encoder=no-such-org/no-such-model", "no-such-org/no-such-model"),
    ("data.name=/no/such/folder", "/no/such/folder"),
    ("optim.lr=fast", "optim.lr"),
])
def test_train_errors_are_clear_and_fast(synthetic_dataset_dir, tiny_bert_dir, tmp_path, capsys, override, needle):
    import time

    from toolgraph.cli import main

    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path) + [override]
    t0 = time.perf_counter()
    assert main(["train", *over]) == 2
    assert time.perf_counter() - t0 < 2.0
    assert needle in capsys.readouterr().err


def test_retrieve_with_a_dependency_graph_brings_the_prerequisite_up(trained, tmp_path, capsys):
    from toolgraph.cli import main

    out, _, _ = trained
    query = "please tell me the weather"
    assert main(["retrieve", "--checkpoint", str(out), "-k", "50", query]) == 0
    plain = [line.split()[2] for line in capsys.readouterr().out.splitlines()[1:]]
    top, last = plain[0], plain[-1]
    graph = tmp_path / "g"
    graph.mkdir()
    (graph / "edges.jsonl").write_text(json.dumps({"header": {"edge_threshold": 0.5}}) + "\n"
                                       + json.dumps({"source": top, "target": last, "prob": 0.9}) + "\n")
    argv = ["retrieve", "--checkpoint", str(out), "-k", "2", "--graph", str(graph), "--graph-option", "alpha=0",
            "--graph-option", "boost=2.0", query]
    assert main(argv) == 0
    boosted = [line.split()[2] for line in capsys.readouterr().out.splitlines()[1:]]
    assert last in boosted  # the least similar tool, needed by the top one, is now in the top 2
    assert main(["retrieve", "--checkpoint", str(out), "--graph", str(graph), "--graph-option", "beta=1", query]) != 0
    assert "unknown key(s) ['beta']" in capsys.readouterr().err


def test_export_with_a_graph_writes_a_tgr_folder_that_loads_for_serving(trained, tmp_path, capsys):
    from toolgraph.cli import main
    from toolgraph.retrieval.tgr import TGRRetriever

    out, summary, _ = trained
    graph = tmp_path / "edges.jsonl"
    graph.write_text(json.dumps({"source": "t1", "target": "t2", "prob": 0.9}) + "\n")  # not this catalog's ids
    assert main(["export", "--checkpoint", summary["best_checkpoint"], "--out", str(tmp_path / "x"),
                 "--graph", str(graph)]) != 0
    assert "none of its 1 edges joins two tools" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # a failed --graph leaves no plain retriever behind
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".x.plain-")]
    graph.write_text(json.dumps({"source": "0", "target": "1", "prob": 0.9}) + "\n")
    folder = tmp_path / "served"
    assert main(["export", "--checkpoint", summary["best_checkpoint"], "--out", str(folder), "--graph", str(graph),
                 "--graph-option", "boost=0.5"]) == 0
    assert "tgr retriever" in capsys.readouterr().out
    served = toolgraph.load(folder)  # what `toolgraph serve --retriever` loads
    assert isinstance(served, TGRRetriever) and served.edges == [("0", "1")] and served.config.boost == 0.5
    assert len(served.retrieve(["weather forecast for the week"], 2).ids[0]) == 2
    assert served._edge_index.shape == (2, 1)  # the boost found its edge among the loaded tools


def test_ema_weights_are_validated_checkpointed_and_exported(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    """trainer.ema_decay: the checkpoint's state_dict is the moving average (the raw weights kept beside
    it), and Lightning's test, the checkpoint and the exported folder all rank with the average."""
    out = tmp_path / "run"
    cfg = load_config(TrainConfig, [], [*tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, out, steps=14),
                                        "trainer.ema_decay=0.8"])
    summary = train(cfg)
    ckpt = torch.load(summary["best_checkpoint"], map_location="cpu", weights_only=True)
    avg, raw = ckpt["state_dict"], ckpt["current_model_state"]
    assert avg.keys() == raw.keys() and any(not torch.equal(avg[k], raw[k]) for k in avg)
    for k in ("recall@1", "recall@3", "ndcg@5"):
        assert summary["test"][f"test/{k}"] == pytest.approx(summary["metrics"][k], abs=1e-5)
    q = ["please tell me the weather and the pizza", "please tell me the taxi"]
    a, b = toolgraph.load(summary["best_checkpoint"]).retrieve(q, 5), toolgraph.load(out).retrieve(q, 5)
    assert a.ids == b.ids and torch.allclose(a.scores, b.scores, atol=1e-4)
    with pytest.raises(ConfigError, match="ema_decay"):
        load_config(TrainConfig, [], ["trainer.ema_decay=1.0"])
