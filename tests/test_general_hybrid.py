"""benchmarks/general_hybrid.py: which leave-one-dataset-out models and WiSE alpha a hybrid row uses,
and the test-as-train table's figures, on hand-made rows (no data, no model)."""

import sys

import pytest
from conftest import load_benchmark

TAT = "zero-shot, test-only datasets train"


@pytest.fixture
def hybrid(monkeypatch):
    return load_benchmark("general_hybrid", monkeypatch)


def lodo_row(dataset, setting, val):
    return {"method": "general_lodo", "dataset": dataset, "setting": setting, "val_recall@5": val}


def hybrid_row(method, dataset, setting, by_w, wise=None):
    return {"method": method, "dataset": dataset, "setting": setting, "wise": wise,
            "metrics": {w: {"recall@5": v} for w, v in by_w.items()}}


def test_the_test_as_train_table_uses_its_own_rows_alpha_and_the_chosen_weight(hybrid):
    rows = [lodo_row("toollens", TAT, {"1.0": 0.40, "0.5": 0.30}), lodo_row("metatool", TAT, {"1.0": 0.80, "0.5": 0.70}),
            lodo_row("toollens", "zero-shot", {"1.0": 0.10, "0.5": 0.90})]  # the main table's rows choose 0.5
    mini = {"toollens": hybrid_row("hybrid_minilm", "toollens", "zero-shot", {"0.0": 0.25, "0.3": 0.35}),
            "metatool": hybrid_row("hybrid_minilm", "metatool", "zero-shot", {"0.0": 0.75, "0.3": 0.76})}
    gen = {"toollens": hybrid_row("hybrid_general", "toollens", TAT, {"0.0": 0.30, "0.3": 0.40}, 1.0),
           "metatool": hybrid_row("hybrid_general", "metatool", TAT, {"0.0": 0.80, "0.3": 0.70}, 0.5)}
    table = hybrid.tat_table(mini, gen, rows, "0.3")
    assert "**1.0** (mean val R@5 alpha 0.5: 0.5000, alpha 1.0: 0.6000)" in table
    assert "| toollens | 0.250 | 0.350 | 1.0 | 0.300 | +0.050 | 0.400 | +0.150 |" in table
    assert "| metatool | 0.750 | 0.760 | 0.5 | 0.800 | +0.050 | 0.700 | -0.050 |" in table  # its own alpha, shown
    assert "| **mean Δ** (2 datasets) | | | | | **+0.050** | | **+0.050** |" in table


def test_the_lodo_choice_names_a_setting_and_a_bad_one_is_refused(hybrid, monkeypatch, capsys):
    assert hybrid.SETTINGS == {"main": "zero-shot", "test-as-train": TAT, "full-finetune": f"{TAT}, full fine-tune",
                               "full-finetune-lr6e-5": f"{TAT}, full fine-tune, lr 6e-5",
                               "self-supervised": f"{TAT}, self-supervised pairs",
                               "bm25-fusion": f"{TAT}, BM25-fused training"}
    assert set(hybrid.BLOCKS) == set(hybrid.SETTINGS.values()) - {"zero-shot"}  # each non-main setting has a block
    assert "general_fullft_lr6e-5.jobs" in hybrid.not_measured(hybrid.SETTINGS["full-finetune-lr6e-5"])
    monkeypatch.setattr(sys, "argv", ["general_hybrid.py", "--lodo", "leaky"])
    with pytest.raises(SystemExit):
        hybrid.main()
    assert "--lodo: invalid choice: 'leaky'" in capsys.readouterr().err


def test_the_full_fine_tune_table_takes_the_alpha_of_its_own_setting(hybrid):
    ft = f"{TAT}, full fine-tune"
    rows = [lodo_row("toollens", TAT, {"1.0": 0.40, "0.5": 0.30}), lodo_row("toollens", ft, {"1.0": 0.30, "0.5": 0.45})]
    mini = {"toollens": hybrid_row("hybrid_minilm", "toollens", "zero-shot", {"0.0": 0.25, "0.3": 0.35})}
    gen = {"toollens": hybrid_row("hybrid_general", "toollens", ft, {"0.0": 0.30, "0.3": 0.42}, 0.5)}
    table = hybrid.tat_table(mini, gen, rows, "0.3", ft)
    assert "**0.5** (mean val R@5 alpha 0.5: 0.4500, alpha 1.0: 0.3000)" in table
    assert "general (test-only datasets train, full fine-tune)" in table
    assert "| toollens | 0.250 | 0.350 | 0.5 | 0.300 | +0.050 | 0.420 | +0.170 |" in table


def test_the_fusion_rule_is_chosen_on_the_other_datasets_val(hybrid):
    def row(d, val, test):
        return {"dataset": d, "val_recall@5": val, "metrics": {k: {"recall@5": v} for k, v in test.items()}}

    rows = [row("a", {"0.0": 0.50, "0.3": 0.60, "rrf:1.0": 0.55}, {"0.0": 0.50, "0.3": 0.70, "rrf:1.0": 0.60}),
            row("b", {"0.0": 0.40, "0.3": 0.42, "rrf:1.0": 0.47}, {"0.0": 0.40, "0.3": 0.30, "rrf:1.0": 0.50}),
            row("c", {}, {"0.0": 0.20, "0.3": 0.25, "rrf:1.0": 0.10})]  # no val split: it never chooses
    assert hybrid.chosen_weight(rows) == ("0.3", pytest.approx({"0.0": 0.45, "0.3": 0.51, "rrf:1.0": 0.51}))  # tie: the first rule
    assert hybrid.lodo_choice(rows) == {"a": "rrf:1.0", "b": "0.3", "c": "0.3"}
    line = hybrid.choice_line(rows, "X")
    # a +0.10 (rrf), b -0.10 (0.3), c +0.05 (0.3)
    assert line == ("X: the rule chosen on the other datasets' val splits, per dataset: 0.3 (2), rrf:1.0 (1); "
                    "mean test R@5 +0.017 over the dense member alone (3 datasets, worst -0.100).")
    assert [hybrid.describe(k) for k in ("0.0", "0.3", "rrf:0.5")] == [
        "the dense member alone", "dense + 0.3 × BM25 (min-max scores)", "RRF (k 60), BM25 weight 0.5"]
    assert sorted(["rrf:0.5", "0.5", "0.0", "rrf:1.0", "0.2"], key=hybrid.rule_order) == ["0.0", "0.2", "0.5", "rrf:0.5", "rrf:1.0"]
