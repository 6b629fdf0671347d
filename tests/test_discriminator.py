"""The 3-class dependency discriminator: report maths, two-stage training through train.py,
init from the pretrain run, config errors."""

import csv
import json
from pathlib import Path

import pytest
import torch

from toolgraph.config import load_config
from toolgraph.data.tdi import TDIConfig, build_tdi, write_tdi
from toolgraph.errors import ConfigError
from toolgraph.tasks.discriminator import classification_report
from toolgraph.training import TrainConfig, train


def test_classification_report_by_hand():
    # rows: true a_needs_b / none / b_needs_a; columns: predicted
    confusion = torch.tensor([[5, 1, 0], [2, 10, 3], [0, 1, 4]])
    r = classification_report(confusion)
    p_a, r_a = 5 / 7, 5 / 6
    p_b, r_b = 4 / 7, 4 / 5
    f_a, f_b = 2 * p_a * r_a / (p_a + r_a), 2 * p_b * r_b / (p_b + r_b)
    assert r["precision_a_needs_b"] == pytest.approx(p_a) and r["recall_a_needs_b"] == pytest.approx(r_a)
    assert r["precision_b_needs_a"] == pytest.approx(p_b) and r["recall_b_needs_a"] == pytest.approx(r_b)
    assert r["macro_f1"] == pytest.approx((f_a + f_b) / 2)
    f_none = 2 * (10 / 12) * (10 / 15) / (10 / 12 + 10 / 15)
    assert r["macro_f1_all"] == pytest.approx((f_a + f_b + f_none) / 3)
    assert r["accuracy"] == pytest.approx(19 / 26)


def test_a_class_never_predicted_has_zero_f1_not_nan():
    r = classification_report(torch.tensor([[0, 3, 0], [0, 5, 0], [0, 2, 0]]))
    assert r["f1_a_needs_b"] == 0.0 and r["macro_f1"] == 0.0


@pytest.fixture(scope="module")
def tdi_dir(dependency_dataset_dir, tmp_path_factory):
    cfg = TDIConfig(sources=[{"dataset": str(dependency_dataset_dir)}], test_fraction=0.25, tool_text="io")
    return write_tdi(build_tdi(cfg), tmp_path_factory.mktemp("tdi"))


def _overrides(tdi_dir: Path, model_dir: Path, out: Path, stage: str, steps: int = 24) -> list[str]:
    return [f"data.name={tdi_dir}", f"model.encoder={model_dir}", f"model.stage={stage}", f"out_dir={out}",
            "data.batch_size=8", "data.eval_batch_size=64", "model.max_pair_length=48", "optim.lr=1e-3",
            "optim.warmup_ratio=0.0", f"trainer.max_steps={steps}", "trainer.max_epochs=100",
            "trainer.val_check_interval=1.0", "trainer.check_val_every_n_epoch=2", "trainer.accelerator=cpu",
            "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=1", "logger.wandb=false",
            "checkpoint.monitor=val/macro_f1"]


def _cfg(overrides):
    return load_config(TrainConfig, [{"model": {"name": "discriminator"}}], overrides)


@pytest.fixture(scope="module")
def pretrain_run(tdi_dir, tiny_bert_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("pre")
    summary = train(_cfg(_overrides(tdi_dir, tiny_bert_dir, out, "pretrain")))
    return out, summary


def test_pretrain_then_finetune_end_to_end(pretrain_run, tdi_dir, tiny_bert_dir, tmp_path):
    out, summary = pretrain_run
    results = json.loads((out / "results.json").read_text())
    assert results["stage"] == "pretrain" and results["loss"] == "ce"
    test_pairs = sum(1 for _ in (tdi_dir / "test.jsonl").open())
    assert sum(map(sum, results["test"]["confusion"])) == test_pairs
    assert 0.0 <= results["test"]["macro_f1"] <= 1.0 and "precision_b_needs_a" in results["test"]
    assert results["pairs"]["pretrain"]["total"] > 0
    per_source = results["test"]["per_source"]
    assert sum(v["pairs"] for v in per_source.values()) == test_pairs
    assert sum(map(sum, next(iter(per_source.values()))["confusion"])) == test_pairs  # one source here
    assert Path(summary["best_checkpoint"]).is_file()
    with (out / "logs" / "metrics.csv").open() as f:
        losses = [float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5  # it learns

    ft_out = tmp_path / "ft"
    ft = train(_cfg(_overrides(tdi_dir, tiny_bert_dir, ft_out, "finetune", steps=8) + [f"model.init_from={out}"]))
    ft_results = json.loads((ft_out / "results.json").read_text())
    assert ft_results["stage"] == "finetune" and ft_results["loss"] == "category_avg"
    assert Path(ft["best_checkpoint"]).is_file()


def test_finetune_starts_from_the_pretrain_weights(pretrain_run, tdi_dir, tiny_bert_dir, tmp_path):
    from toolgraph.retrieval.loading import load_task
    from toolgraph.tasks.discriminator import DiscriminatorTask

    out, summary = pretrain_run
    cfg = _cfg(_overrides(tdi_dir, tiny_bert_dir, tmp_path, "finetune") + [f"model.init_from={out}"])

    task = DiscriminatorTask(cfg)
    pre = load_task(summary["best_checkpoint"])
    for (name, a), (_, b) in zip(task.network.state_dict().items(), pre.network.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_dataset_class_counts_reach_the_loss(tdi_dir, tiny_bert_dir, tmp_path):
    from toolgraph.tasks.discriminator import DiscriminatorTask

    cfg = _cfg(_overrides(tdi_dir, tiny_bert_dir, tmp_path, "finetune") + ["model.class_count=dataset"])
    task = DiscriminatorTask(cfg)
    dm = task.datamodule_for()
    assert task.class_counts.tolist() == dm.class_counts() and sum(dm.class_counts()) == len(dm.train_pairs)
    batch = next(iter(dm.train_dataloader()))
    assert torch.isfinite(task.training_step(batch, 0))


@pytest.mark.parametrize("override, key", [("model.stage=warmup", "model.stage"), ("model.loss=focal", "model.loss"),
                                           ("model.class_count=epoch", "model.class_count"),
                                           ("model.init_from=/nowhere", "model.init_from")])
def test_bad_discriminator_settings_name_the_key(tdi_dir, tiny_bert_dir, tmp_path, override, key):
    from toolgraph.tasks.discriminator import DiscriminatorTask

    with pytest.raises(ConfigError, match=key):  # allowed values fail when the config loads, the rest at build
        DiscriminatorTask(_cfg(_overrides(tdi_dir, tiny_bert_dir, tmp_path, "finetune") + [override]))


def test_monitor_must_be_a_discriminator_metric(tdi_dir, tiny_bert_dir, tmp_path):
    cfg = _cfg(_overrides(tdi_dir, tiny_bert_dir, tmp_path, "pretrain") + ["checkpoint.monitor=val/recall@5"])
    with pytest.raises(ConfigError, match="checkpoint.monitor.*val/macro_f1"):
        train(cfg)


def test_tdi_options_are_checked(tiny_bert_dir, tmp_path):
    from toolgraph.tasks.discriminator import load_tdi

    with pytest.raises(ConfigError, match="unknown TDI option.*negatives"):
        load_tdi("tdi", {"negatives": 3}, None)
    with pytest.raises(ConfigError, match="data.options apply"):
        load_tdi(str(tmp_path), {"seed": 1}, None)


def test_resume_mid_epoch_matches_uninterrupted(tdi_dir, tiny_bert_dir, tmp_path):
    """Pair batches come from the seeded sampler and the checkpoint records the batches done, so a
    run stopped at step 4 and resumed reaches the same weights as one run of 8 steps."""
    def run(out, steps, extra=()):
        over = [o for o in _overrides(tdi_dir, tiny_bert_dir, out, "pretrain", steps)
                if not o.startswith(("data.batch_size", "trainer.val_check_interval", "trainer.check_val"))]
        over += ["data.batch_size=4", "trainer.limit_val_batches=0", "test=false", "export=false",
                 "optim.schedule=constant", "checkpoint.every_n_train_steps=4", *extra]
        train(_cfg(over))
        return torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)

    ref = run(tmp_path / "ref", 8)
    assert ref["global_step"] == 8
    first = run(tmp_path / "run", 4)
    assert first["global_step"] == 4 and first["loops"]["fit_loop"]["epoch_progress"]["current"]["completed"] == 0
    resumed = run(tmp_path / "run", 8, ["resume=auto"])
    assert resumed["global_step"] == 8
    for k, v in ref["state_dict"].items():
        assert torch.equal(v, resumed["state_dict"][k]), k
