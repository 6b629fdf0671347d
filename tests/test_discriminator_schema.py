"""The schema discriminator: pair features, order consistency, calibration, training, graph scoring."""

import json

import pytest
import torch

from toolgraph.config import load_config
from toolgraph.data import load_dataset
from toolgraph.data.tdi import TDIConfig, build_tdi, read_tdi, write_tdi
from toolgraph.depgraph import GraphConfig, build_graph, score_pairs
from toolgraph.errors import ConfigError, DataError
from toolgraph.nn.calibration import edge_threshold, fit_temperature, reliability
from toolgraph.nn.pair_features import (
    DIRECTION_FEATURES,
    N_FEATURES,
    SchemaPairHead,
    build_views,
    feature_matrix,
    pair_features,
    tokens,
    words,
)
from toolgraph.retrieval.loading import load_task
from toolgraph.training import TrainConfig, train


def _fake_embed(texts):
    """Deterministic unit vectors from the words of a text (shared words -> positive cosine)."""
    out = torch.zeros(len(texts), 16)
    for i, t in enumerate(texts):
        for w in t.lower().replace("_", " ").split():
            out[i, hash(w) % 16] += 1.0
    return torch.nn.functional.normalize(out + 1e-3, dim=-1)


FIELDS = {
    "login": {"name": "login_bank", "description": "sign in", "parameters": ["user", "password"],
              "returns": ["bank_token"], "category": "bank", "agent": None},
    "use": {"name": "use_bank", "description": "act in the bank", "parameters": ["bankToken", "action"],
            "returns": ["status"], "category": "bank", "agent": None},
    "misc": {"name": "misc", "description": "helper", "parameters": [], "returns": [], "category": None, "agent": None},
}
DOCS = {k: f"{v['name']}: {v['description']}" for k, v in FIELDS.items()}


def test_field_words_and_tokens_match_across_naming_styles():
    assert words("getUserID") == "get user id" and words("bank_token") == "bank token"
    assert tokens("bankTokens") == tokens("bank_token") == {"bank", "token"}


def test_direction_features_see_which_side_feeds_which():
    views = build_views(FIELDS, DOCS, _fake_embed)
    names = list(DIRECTION_FEATURES)
    use_needs_login = pair_features(views["use"], views["login"])
    n = len(names)
    forward, backward = use_needs_login[:n], use_needs_login[n:2 * n]
    jac = names.index("jaccard_param_return_tokens")
    assert forward[jac] == pytest.approx(2 / 3) and backward[jac] == 0.0  # {bank, token} of {bank, token, action}
    assert forward[names.index("exact_param_return")] == 0.0  # names differ in case style: tokens, not exact
    assert len(use_needs_login) == N_FEATURES
    assert pair_features(views["misc"], views["use"])[names.index("has_params")] == 0.0


def test_swapping_the_pair_swaps_the_dependency_classes_exactly():
    torch.manual_seed(0)
    views = build_views(FIELDS, DOCS, _fake_embed)
    pairs = [("use", "login"), ("login", "misc"), ("misc", "use")]
    x, x_rev = feature_matrix(views, pairs), feature_matrix(views, [(b, a) for a, b in pairs])
    head = SchemaPairHead(hidden=8, dropout=0.0)
    assert torch.equal(x[:, head.swap], x_rev)  # the feature layout is what the head assumes
    head.fit_scale(torch.randn(20, N_FEATURES))
    assert torch.allclose(head(x_rev), head(x)[:, [2, 1, 0]], atol=1e-6)
    with_vectors = SchemaPairHead(vector_dim=4, hidden=8, dropout=0.0)
    v = torch.randn(3, 4)  # order-free vectors: the same for both orders
    assert torch.allclose(with_vectors(x_rev, v), with_vectors(x, v)[:, [2, 1, 0]], atol=1e-6)


def test_temperature_scaling_recovers_an_overconfident_model():
    torch.manual_seed(0)
    true_logits = torch.randn(4000, 3) * 1.5
    labels = torch.distributions.Categorical(logits=true_logits).sample()
    overconfident = true_logits * 3  # a model 3x too sure of itself
    t = fit_temperature(overconfident, labels)
    assert 2.6 < t < 3.4
    before = reliability(overconfident.softmax(-1), labels)
    after = reliability((overconfident / t).softmax(-1), labels)
    assert after["ece"] < 0.03 < before["ece"]
    assert sum(b["count"] for b in after["bins"]) == 4000


def test_edge_threshold_is_picked_where_directed_f1_peaks():
    probs = torch.tensor([[0.9, 0.05, 0.05], [0.6, 0.3, 0.1], [0.4, 0.5, 0.1], [0.1, 0.2, 0.7]])
    labels = torch.tensor([0, 1, 1, 2])
    threshold, f1 = edge_threshold(probs, labels)
    assert 0.6 < threshold <= 0.7 and f1 == 1.0  # keeps 0.9 and 0.7, drops 0.6


def test_tool_disjoint_val_shares_no_tool_with_training(dependency_dataset_dir):
    tdi = build_tdi(TDIConfig(sources=[{"dataset": str(dependency_dataset_dir)}], test_fraction=0.25,
                              val_fraction=0.25, val_split="tools"))
    train, val, test = (tdi.tools_of(n) for n in ("finetune", "val", "test"))
    assert val and not (val & train) and not (val & test) and not (train & test)
    with pytest.raises(ConfigError, match="val_split"):
        build_tdi(TDIConfig(sources=[{"dataset": str(dependency_dataset_dir)}], val_split="random"))


def test_fields_travel_through_the_tdi_folder_and_bad_ones_name_the_line(dependency_dataset_dir, tmp_path):
    tdi = build_tdi(TDIConfig(sources=[{"dataset": str(dependency_dataset_dir)}], test_fraction=0.25))
    folder = write_tdi(tdi, tmp_path / "tdi")
    back = read_tdi(folder)
    used = back.tools_of("test") | back.tools_of("finetune")
    assert {t: back.fields[t] for t in used} == {t: tdi.fields[t] for t in used}
    login = next(t for t in used if t.endswith(":login_bank"))
    assert back.fields[login]["returns"] == ["bank_token"]
    lines = (folder / "val.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    row["fields_a"]["returns"] = "bank_token"  # a string, not a list
    lines[1] = json.dumps(row)
    (folder / "val.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"val\.jsonl.*2.*'returns' must be a list"):
        read_tdi(folder)


def _train(tdi_folder, encoder, out, *extra):
    over = [f"data.name={tdi_folder}", f"model.encoder={encoder}", f"out_dir={out}", "data.batch_size=16",
            "optim.lr=1e-2", "trainer.max_epochs=8", "trainer.accelerator=cpu", "trainer.devices=1",
            "trainer.enable_progress_bar=false", "logger.wandb=false", "checkpoint.monitor=val/macro_f1",
            f"model.cache_dir={out}/cache", *extra]
    base = {"model": {"name": "discriminator_schema", "hidden": 32},
            "optim": {"warmup_ratio": 0.0, "schedule": "constant", "weight_decay": 1.0e-4}}
    return train(load_config(TrainConfig, [base], over))


@pytest.fixture(scope="module")
def schema_run(dependency_dataset_dir, tiny_bert_dir, tmp_path_factory):
    tdi = write_tdi(build_tdi(TDIConfig(sources=[{"dataset": str(dependency_dataset_dir)}], test_fraction=0.25,
                                        val_split="tools", tool_text="io")), tmp_path_factory.mktemp("tdi"))
    out = tmp_path_factory.mktemp("schema") / "run"
    return tdi, out, _train(tdi, tiny_bert_dir, out)


def test_schema_discriminator_learns_the_fixture_and_reports_calibration(schema_run):
    _, out, summary = schema_run
    results = json.loads((out / "results.json").read_text())
    test = results["test"]
    # the dependency is written in the fields (do_w takes w_token, login_w returns it): unseen tools too
    assert test["macro_f1"] >= 0.9, test["confusion"]
    cal = test["calibration"]
    assert cal["temperature"] > 0 and 0 <= cal["ece_after"] <= 1 and 0.05 <= cal["edge_threshold"] <= 0.95
    assert sum(b["count"] for b in cal["reliability_after"]) == sum(map(sum, test["confusion"]))
    assert list((out / "cache").iterdir()), "the field embeddings are cached on disk"


def test_schema_checkpoint_loads_and_scores_graph_pairs_in_both_orders(schema_run, dependency_dataset_dir):
    _, _, summary = schema_run
    task = load_task(summary["best_checkpoint"])
    assert float(task.temperature) != 1.0 or float(task.edge_threshold) != 0.5  # fitted on val, saved
    ds = load_dataset(str(dependency_dataset_dir))
    tools = {t.id: t for t in ds.tools}
    pairs = [("do_bank", "login_bank"), ("login_bank", "do_bank"), ("misc0", "do_mail")]
    probs, _ = score_pairs(task, tools, pairs, "io", GraphConfig(batch_size=2, accelerator="cpu"))
    assert torch.allclose(probs[1], probs[0][[2, 1, 0]], atol=1e-5)  # one model, both orders agree
    assert probs[0, 0] > 0.5 and probs[2, 1] > 0.5
    edges, stats = build_graph(ds, task, GraphConfig(top_m=0, accelerator="cpu", threshold=0.5))
    assert stats["gold_pairs_in_candidates"] == 1.0 and stats["gold_edges_recovered"] >= 0.9
    assert stats["edge_precision"] >= 0.9


def test_a_tdi_folder_without_fields_is_refused_by_name(schema_run, tiny_bert_dir, tmp_path):
    tdi, _, _ = schema_run
    bare = tmp_path / "bare"
    bare.mkdir()
    for path in tdi.glob("*.jsonl"):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        bare.joinpath(path.name).write_text("".join(
            json.dumps({k: v for k, v in r.items() if not k.startswith("fields_")}) + "\n" for r in rows))
    with pytest.raises(ConfigError, match=r"bare.*no schema fields.*toolgraph data tdi build"):
        _train(bare, tiny_bert_dir, tmp_path / "out")


def test_init_from_continues_a_schema_run_and_refuses_a_cross_encoder(schema_run, tiny_discriminator_ckpt,
                                                                     tiny_bert_dir, tmp_path):
    tdi, _, summary = schema_run
    before = load_task(summary["best_checkpoint"]).head
    again = _train(tdi, tiny_bert_dir, tmp_path / "again", f"model.init_from={summary['best_checkpoint']}",
                   "trainer.max_epochs=1", "optim.lr=1e-9")
    after = load_task(again["best_checkpoint"]).head
    assert torch.allclose(after.mlp[0].weight, before.mlp[0].weight, atol=1e-6)  # not a fresh random head
    with pytest.raises(ConfigError, match="is a 'discriminator' checkpoint, not a 'discriminator_schema' one"):
        _train(tdi, tiny_bert_dir, tmp_path / "cross", f"model.init_from={tiny_discriminator_ckpt}")


def test_calibration_fits_on_the_val_pairs_of_tested_sources():
    from types import SimpleNamespace

    from toolgraph.data.tdi import Pair, TDISet
    from toolgraph.tasks.discriminator import DiscriminatorTask

    val = [Pair("a", "b", "none", "nestools", "easy"), Pair("c", "d", "a_needs_b", "ultratool", "order", 0.5),
           Pair("e", "f", "b_needs_a", "toollinkos", "dependency")]
    test = [Pair("g", "h", "none", "nestools", "easy"), Pair("i", "j", "none", "toollinkos", "easy")]
    tdi = TDISet({}, {"val": val, "test": test})
    stub = SimpleNamespace(trainer=SimpleNamespace(datamodule=SimpleNamespace(tdi=tdi)))
    keep = DiscriminatorTask.calibration_pairs(stub, torch.tensor([2, 0, 1]))
    assert keep.tolist() == [True, True, False]  # UltraTool is never tested: it does not calibrate
    only_untested = TDISet({}, {"val": [val[1]], "test": test})
    stub.trainer.datamodule.tdi = only_untested
    assert DiscriminatorTask.calibration_pairs(stub, torch.tensor([0])).tolist() == [True]  # nothing else: all
