"""MLC: loss definitions, the training run on synthetic data, the exported retriever."""

import pytest
import torch
from conftest import tiny_train_overrides

import toolgraph
from toolgraph.config import load_config
from toolgraph.data.schema import Tool
from toolgraph.errors import DataError
from toolgraph.nn.heads import multi_hot
from toolgraph.nn.losses import multilabel_loss
from toolgraph.training import TrainConfig, train


def mlc_overrides(data_dir, model_dir, out, loss="bce", steps=40):
    base = [o for o in tiny_train_overrides(data_dir, model_dir, out, steps) if not o.startswith("model.")]
    return base + ["model.name=mlc", f"model.encoder={model_dir}", f"model.loss={loss}", "model.head_lr=5e-2"]


def test_multi_hot_ignores_padding():
    gold = torch.tensor([[0, 2, -1], [1, -1, -1]])
    assert multi_hot(gold, 3).tolist() == [[1, 0, 1], [0, 1, 0]]


def test_softmax_loss_is_mean_negative_log_prob_of_gold():
    logits = torch.tensor([[2.0, 0.0, -1.0, 0.5]])
    target = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    logp = torch.log_softmax(logits, 1)[0]
    assert multilabel_loss(logits, target, "softmax").item() == pytest.approx(-(logp[0] + logp[3]).item() / 2)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
    assert multilabel_loss(logits, target, "bce").item() == pytest.approx(bce.item())
    with pytest.raises(ValueError, match="bce' or 'softmax"):
        multilabel_loss(logits, target, "hinge")


def test_loss_mask_excludes_padded_items():
    logits = torch.tensor([[1.0, 0.0, 50.0]])
    target = torch.tensor([[1.0, 0.0, 0.0]])
    valid = torch.tensor([[True, True, False]])
    assert multilabel_loss(logits, target, "softmax", valid).item() == pytest.approx(
        -torch.log_softmax(logits[:, :2], 1)[0, 0].item())


@pytest.fixture(scope="module", params=["bce", "softmax"])
def trained(request, synthetic_dataset_dir, tiny_bert_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"mlc-{request.param}")
    cfg = load_config(TrainConfig, [], mlc_overrides(synthetic_dataset_dir, tiny_bert_dir, out, request.param))
    return out, train(cfg)


def test_mlc_learns_and_exports(trained):
    out, summary = trained
    assert summary["metrics"]["recall@3"] > 0.5  # chance is ~0.12 on 24 tools
    for k in ("recall@1", "recall@3", "ndcg@5"):  # Lightning's test equals the exported retriever's evaluation
        assert summary["test"][f"test/{k}"] == pytest.approx(summary["metrics"][k], abs=1e-5)
    from_ckpt = toolgraph.load(summary["best_checkpoint"])
    from_folder = toolgraph.load(out)
    q = ["please tell me the weather and the pizza"]
    a, b = from_ckpt.retrieve(q, 5), from_folder.retrieve(q, 5)
    assert a.ids == b.ids and torch.allclose(a.scores, b.scores, atol=1e-4)


def test_tools_the_head_never_saw_rank_last_or_fail(trained):
    out, _ = trained
    r = toolgraph.load(out)
    r.add_tools([Tool("new", "get_weather_now", "returns weather information for the user")])
    assert r.unscored == ["new"]
    assert r.retrieve(["please tell me the weather"], len(r.tools)).ids[0][-1] == "new"
    r.config.unseen = "error"
    with pytest.raises(DataError, match="no output for 1 tool"):
        r.index(r.tools)


def test_export_command_writes_the_checkpoints_retriever(trained, tmp_path, capsys):
    from toolgraph.cli import main

    out, summary = trained
    assert main(["export", "--checkpoint", summary["best_checkpoint"], "--out", str(tmp_path / "exp")]) == 0
    assert "mlc retriever over 24 tools" in capsys.readouterr().out
    q = ["please tell me the music"]
    assert toolgraph.load(tmp_path / "exp").retrieve(q, 3).ids == toolgraph.load(out).retrieve(q, 3).ids


def test_resaved_and_in_memory_retrievers_carry_their_encoder(trained, tmp_path):
    from toolgraph.retrieval.loading import load_task

    out, summary = trained
    q = ["please tell me the music"]
    want = toolgraph.load(out).retrieve(q, 3).ids
    toolgraph.load(out).save(tmp_path / "copy")  # e.g. a pipeline saving its first stage
    load_task(summary["best_checkpoint"]).as_retriever().save(tmp_path / "mem")
    for folder in ("copy", "mem"):
        assert (tmp_path / folder / "encoder" / "config.json").is_file()
        assert toolgraph.load(tmp_path / folder).retrieve(q, 3).ids == want


def test_head_learns_at_its_own_rate(trained):
    from toolgraph.retrieval.loading import load_task

    _, summary = trained
    task = load_task(summary["best_checkpoint"])
    groups = task.param_groups()
    head = {id(p) for p in task.model.head.parameters()}
    fast = [g for g in groups if g.get("lr") == 5e-2]
    assert fast and {id(p) for g in fast for p in g["params"]} == head
    assert sum(len(g["params"]) for g in groups) == len({id(p) for p in task.parameters()})
