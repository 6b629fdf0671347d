"""Issue 20, config side: values range-checked at load with the full key named (findings 6, 11), and
no ``${...}`` interpolation resolved from a saved config (finding 10)."""

import json
import os

import pytest

from toolgraph.cli import main as cli
from toolgraph.config import EvaluateConfig, TrainConfig, config_from_dict, load_config
from toolgraph.errors import ConfigError, DataError

BAD = [  # (schema, files, override, the key the error must name)
    (TrainConfig, [], "model.temperature=0", "model.temperature"),  # finding 6: all-NaN "best" checkpoint
    (TrainConfig, [], "model.temperature=-0.1", "model.temperature"),
    (TrainConfig, [{"model": {"name": "graph"}}], "model.temperature=0", "model.temperature"),
    (TrainConfig, [], "optim.lr=0", "optim.lr"),
    (TrainConfig, [], "optim.lr=-1e-5", "optim.lr"),
    (TrainConfig, [], "optim.lr=nan", "optim.lr"),
    (TrainConfig, [], "optim.warmup_ratio=2", "optim.warmup_ratio"),
    (TrainConfig, [], "optim.betas=[0.9]", "optim.betas"),
    (TrainConfig, [], "data.batch_size=0", "data.batch_size"),
    (TrainConfig, [], "data.eval_batch_size=-4", "data.eval_batch_size"),
    (TrainConfig, [], "data.max_query_length=0", "data.max_query_length"),
    (TrainConfig, [], "trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches"),
    (TrainConfig, [], "trainer.val_check_interval=abc", "trainer.val_check_interval"),  # "steps": "abc" style
    (TrainConfig, [], "trainer.val_check_interval=0", "trainer.val_check_interval"),
    (TrainConfig, [], "trainer.val_check_interval=1.5", "trainer.val_check_interval"),
    (TrainConfig, [], "trainer.devices=abc", "trainer.devices"),
    (TrainConfig, [], "trainer.limit_train_batches=abc", "trainer.limit_train_batches"),
    (TrainConfig, [], "trainer.log_every_n_steps=0", "trainer.log_every_n_steps"),
    (TrainConfig, [], "checkpoint.every_n_train_steps=0", "checkpoint.every_n_train_steps"),
    (TrainConfig, [], "model.hard_negative_depth=0", "model.hard_negative_depth"),
    (TrainConfig, [], "eval.ks=[0,5]", "eval.ks"),
    (EvaluateConfig, [], "eval.ks=[1,-5]", "eval.ks"),
    (EvaluateConfig, [], "eval.ks=[]", "eval.ks"),
    (EvaluateConfig, [], "eval.metrics=[]", "eval.metrics"),
    (EvaluateConfig, [], "eval.depth=0", "eval.depth"),
    (EvaluateConfig, [{"eval": {"ks": [1, 10]}}], "eval.depth=5", "eval.depth"),  # depth >= max(ks)
    (EvaluateConfig, [], "eval.max_queries=-1", "eval.max_queries"),  # finding 11: silently dropped queries
    (EvaluateConfig, [], "eval.max_queries=0", "eval.max_queries"),
    (EvaluateConfig, [], "eval.batch_size=0", "eval.batch_size"),
    (EvaluateConfig, [], "retriever.k1=-1", "retriever.k1"),  # finding 11: BM25 k1 < 0 accepted
    (EvaluateConfig, [], "retriever.b=1.5", "retriever.b"),
    (EvaluateConfig, [{"retriever": {"name": "dense"}}], "retriever.batch_size=0", "retriever.batch_size"),
    (EvaluateConfig, [{"retriever": {"name": "losemb"}}], "retriever.temperature=0", "retriever.temperature"),
    (EvaluateConfig, [{"retriever": {"name": "tgr"}}], "retriever.threshold=2", "retriever.threshold"),
    (EvaluateConfig, [{"retriever": {"name": "t2a"}}], "retriever.servers=0", "retriever.servers"),
]


@pytest.mark.parametrize(("schema", "files", "override", "key"), BAD, ids=[b[2] for b in BAD])
def test_out_of_range_values_fail_at_load_naming_the_full_key(schema, files, override, key):
    with pytest.raises(ConfigError) as e:
        load_config(schema, files, [override])
    assert f"'{key}'" in str(e.value), str(e.value)
    assert f"override '{override}'" in str(e.value) or key == "eval.depth"  # names where the value came from


def test_the_error_names_the_yaml_file_that_set_the_value(tmp_path):
    path = tmp_path / "eval.yaml"
    path.write_text("retriever: {name: bm25, k1: -0.5}\n")
    with pytest.raises(ConfigError, match=r"eval\.yaml: key 'retriever\.k1': must be >= 0"):
        load_config(EvaluateConfig, [path])


@pytest.mark.parametrize("override", ["trainer.val_check_interval=7", "trainer.val_check_interval=0.25",
                                      "trainer.val_check_interval=00:00:30:00", "trainer.devices=2",
                                      "trainer.devices=[0,1]", "trainer.devices=-1", "trainer.devices=auto",
                                      "trainer.limit_val_batches=0.5", "trainer.limit_val_batches=3",
                                      "eval.max_queries=null", "eval.max_queries=1", "trainer.max_epochs=-1",
                                      "model.temperature=1e-4", "optim.lr=1"])
def test_values_inside_their_ranges_still_load(override):
    load_config(TrainConfig, [], [override])


def test_bm25_range_edges_load():
    cfg = load_config(EvaluateConfig, [], ["retriever.k1=0", "retriever.b=0"])
    assert cfg.retriever.k1 == 0 and cfg.retriever.b == 0
    assert load_config(EvaluateConfig, [], ["retriever.b=1"]).retriever.b == 1


def test_a_config_built_in_code_gets_the_same_checks():
    """Choices and ranges hold for configs that never went through a file: a retriever built in code
    refuses a wrong choice (also inside a list) or an out-of-range value, naming the key."""
    from toolgraph.config import EvalConfig, check_values
    from toolgraph.registry import RETRIEVERS

    bm25 = RETRIEVERS.get("bm25")
    with pytest.raises(ConfigError, match=r"'retriever\.method': must be one of"):
        bm25(bm25.Config(method="okapi"))
    with pytest.raises(ConfigError, match=r"'retriever\.k1': must be >= 0"):
        bm25(bm25.Config(k1=-1.0))
    with pytest.raises(ConfigError, match=r"'eval\.metrics': must be one of .*got 'recal'"):
        check_values(EvalConfig(metrics=["recall", "recal"]), "eval.")
    assert bm25(bm25.Config(k1=0.0)).config.k1 == 0.0


# ---- finding 10: saved configs are never resolved -------------------------------------------------
SECRET = "hunter2-not-for-files"


@pytest.fixture
def secret_env(monkeypatch):
    monkeypatch.setenv("TOOLGRAPH_TEST_SECRET", SECRET)
    return "${oc.env:TOOLGRAPH_TEST_SECRET}"


def test_a_checkpoint_config_is_not_interpolated(secret_env):
    saved = {"model": {"name": "bi_encoder", "encoder": secret_env}, "out_dir": "runs/x"}
    with pytest.raises(ConfigError, match="interpolation") as e:
        config_from_dict(saved)
    assert "model.encoder" in str(e.value) and SECRET not in str(e.value)


def test_a_saved_retriever_json_is_not_interpolated(tiny_dataset_dir, tmp_path, secret_env):
    from toolgraph import load
    from toolgraph.data import load_dataset
    from toolgraph.retrieval.bm25 import BM25Retriever

    folder = tmp_path / "bm25"
    r = BM25Retriever()
    r.index(load_dataset(str(tiny_dataset_dir)).tools)
    r.save(folder)
    meta = json.loads((folder / "retriever.json").read_text())
    meta["config"]["stopwords"] = secret_env
    (folder / "retriever.json").write_text(json.dumps(meta))
    (folder / "manifest.json").unlink(missing_ok=True)  # a folder as older versions wrote it: no manifest
    with pytest.raises((ConfigError, DataError), match="interpolation") as e:
        load(folder)
    assert SECRET not in str(e.value)


def test_index_sync_never_writes_a_resolved_secret(mcp_catalog, tiny_bert_dir, tmp_path, secret_env, capsys):
    import yaml

    cfg = tmp_path / "index.yaml"
    cfg.write_text(yaml.safe_dump({"retriever": {
        "name": "t2a", "scorer": "rrf",
        "dense": {"name": "dense", "model": str(tiny_bert_dir), "cache_dir": None, "progress": False,
                  "query_prefix": secret_env}}}))
    index = tmp_path / "index"
    code = cli(["index", "sync", str(mcp_catalog[0]), "--index", str(index), "--retriever-config", str(cfg)])
    err = capsys.readouterr().err
    written = [p for p in tmp_path.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not written, f"the secret was written to {written}"
    assert code == 2 and "interpolation" in err and str(cfg) in err and "dense.query_prefix" in err
    assert not index.exists()


def test_user_yaml_and_overrides_may_still_interpolate(tmp_path, secret_env):
    path = tmp_path / "run.yaml"
    path.write_text("logger: {run_name: '${oc.env:TOOLGRAPH_TEST_SECRET}'}\n")
    assert load_config(TrainConfig, [path]).logger.run_name == SECRET
    assert load_config(TrainConfig, [], [f"logger.project={secret_env}"]).logger.project == SECRET


def test_saving_a_config_never_resolves_a_literal(secret_env):
    from toolgraph.config import to_dict
    from toolgraph.retrieval.bm25 import BM25Config

    assert to_dict(BM25Config(stopwords=secret_env))["stopwords"] == secret_env
    assert os.environ["TOOLGRAPH_TEST_SECRET"] == SECRET
