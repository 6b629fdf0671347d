"""A run cut short by ``trainer.max_steps`` still ends with a validation and keeps a best checkpoint."""

import json

from conftest import tiny_train_overrides

from toolgraph.cli import main as cli


def test_a_run_shorter_than_its_validation_interval_is_validated_at_its_last_step(
        synthetic_dataset_dir, tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "run"
    # validation every 7 batches, but the run stops after 4: before, no validation ran and no best-*.ckpt
    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, out, steps=4)
    assert cli(["train", *over]) == 0
    err = capsys.readouterr().err
    assert "no validation ran" not in err, err[-2000:]
    best = sorted(p.name for p in (out / "checkpoints").glob("best-*.ckpt"))
    assert best == ["best-0-4.ckpt"], best
    training = json.loads((out / "results.json").read_text())["training"]
    assert training["best_checkpoint"].endswith("best-0-4.ckpt") and "warnings" not in training
    rows = (out / "logs" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    col = header.index("val/recall@3")
    validated = [r.split(",") for r in rows[1:] if r.split(",")[col] != ""]
    assert len(validated) == 1  # one validation at step 4, not two


def test_a_validation_point_on_the_last_step_validates_once(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    out = tmp_path / "run"
    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, out, steps=14)  # validations at 7 and 14
    assert cli(["train", *over]) == 0
    rows = (out / "logs" / "metrics.csv").read_text().splitlines()
    col = rows[0].split(",").index("val/recall@3")
    assert sum(r.split(",")[col] != "" for r in rows[1:]) == 2
