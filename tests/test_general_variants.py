"""benchmarks/general.py: labelled leave-one-dataset-out runs (``lodo --label``) are compared with the
unlabelled row of the same dataset and setting, on val first, on hand-made rows (no data, no model)."""

import pytest
from conftest import load_benchmark

TAT = "zero-shot, test-only datasets train"


@pytest.fixture
def general(monkeypatch):
    return load_benchmark("general", monkeypatch)


def row(dataset, setting, val, test, label=None, device="cpu"):
    return {"method": "general_lodo", "dataset": dataset, "setting": setting + (f", {label}" if label else ""),
            "label": label, "val_recall@5": val, "metrics": {"recall@5": test}, "device": {"cpu": "cpu: 1 process(es) x 2 threads, 2 cores available"}.get(device, device)}


def test_a_variant_is_compared_with_the_base_row_of_its_own_setting(general):
    rows = [row("toollens", TAT, {"1.0": 0.30, "0.5": 0.20}, 0.31), row("toollens", "zero-shot", {"1.0": 0.9}, 0.9),
            row("metatool", TAT, {"1.0": 0.70, "0.5": 0.60}, 0.80), row("nestools", TAT, {}, 0.50),
            row("toollens", TAT, {"1.0": 0.34, "0.5": 0.21}, 0.30, "prefixes"),
            row("metatool", TAT, {"1.0": 0.68, "0.5": 0.62}, 0.82, "prefixes"),
            row("nestools", TAT, {}, 0.55, "prefixes"),
            row("api-bank", TAT, {"1.0": 0.9}, 0.7, "prefixes")]  # no base row: shown, not averaged
    labelled = [r for r in rows if r["label"]]
    table = general.variants_table(labelled, rows)
    assert "| prefixes | toollens | 0.3000 → 0.3400 | 0.2000 → 0.2100 | 0.3100 → 0.3000 | main, same device | CPU, 2 threads |" in table
    assert "| prefixes | api-bank | – → 0.9000 | – | – → 0.7000 | – | CPU, 2 threads |" in table
    # val at alpha 1.0: (+0.04 - 0.02) / 2; alpha 0.5: (+0.01 + 0.02) / 2; test over three datasets
    assert "| **prefixes: mean change** (datasets) | | +0.0100 (2) | +0.0150 (2) | +0.0200 (3) | | |" in table
    lines = table.splitlines()
    assert [ln.split(" | ")[1] for ln in lines[2:6]] == ["toollens", "metatool", "api-bank", "nestools"]


def test_a_variant_on_another_device_than_the_main_row_is_compared_with_a_rerun_there(general):
    rows = [row("toollens", TAT, {"1.0": 0.30}, 0.31, device="gpu"),
            row("toollens", TAT, {"1.0": 0.28}, 0.29, "rerun"),  # the base recipe again, on the CPU
            row("toollens", TAT, {"1.0": 0.33}, 0.30, "prefixes"),
            row("metatool", TAT, {"1.0": 0.70}, 0.80, device="gpu"),
            row("metatool", TAT, {"1.0": 0.72}, 0.81, "prefixes")]  # no CPU base: the main row, marked
    table = general.variants_table([r for r in rows if r["label"]], rows)
    assert "| rerun | toollens | 0.3000 → 0.2800 | – | 0.3100 → 0.2900 | main, gpu | CPU, 2 threads |" in table
    assert "| prefixes | toollens | 0.2800 → 0.3300 | – | 0.2900 → 0.3000 | rerun, same device | CPU, 2 threads |" in table
    assert "| prefixes | metatool | 0.7000 → 0.7200 | – | 0.8000 → 0.8100 | main, gpu | CPU, 2 threads |" in table


def test_labelled_rows_stay_out_of_the_test_as_train_table(general, tmp_path, monkeypatch):
    import json

    results = tmp_path / "results"
    results.mkdir()
    base = {"variants": {"wise-0.5": {"recall@5": 0.3, "ndcg@5": 0.3}}, "minilm": {"recall@5": 0.25},
            "train_queries": 10, "steps": 100, "test_as_train": ["x"]}
    rows = [{**row("toollens", TAT, {"1.0": 0.30, "0.5": 0.20}, 0.31), **base},
            {**row("toollens", TAT, {"1.0": 0.99, "0.5": 0.99}, 0.99, "prefixes"), **base}]
    for r in rows:
        r["metrics"]["ndcg@5"] = 0.3
    (results / "general.json").write_text(json.dumps({"rows": rows}))
    page = tmp_path / "general.md"
    page.write_text("".join(f"<!-- {b}:start -->\n<!-- {b}:end -->\n"
                            for b in ("general-lodo", "general-test-as-train", "general-variants", "general-recipes")))
    monkeypatch.setattr(general, "RESULTS", results)
    general.render(page)
    text = page.read_text()
    tat = text.split("general-test-as-train:start")[1].split("general-test-as-train:end")[0]
    assert "0.310" in tat and "0.990" not in tat and "mean of 1" in tat
    assert "| prefixes | toollens | 0.3000 → 0.9900 |" in text


def test_a_model_folder_is_reused_only_for_the_same_queries_and_recipe(general):
    key = general.model_key(["b", "a"], None, [], ["trainer.max_steps=100"])
    assert key == general.model_key(["a", "b"], None, [], ["trainer.max_steps=100"])  # order-free
    others = [general.model_key(["a", "b", "c"], None, [], ["trainer.max_steps=100"]),
              general.model_key(["a", "b"], "prefixes", [], ["trainer.max_steps=100"]),
              general.model_key(["a", "b"], None, [], ["trainer.max_steps=150"]),
              general.model_key(["a", "b"], None, ["configs/cluster/1gpu.yaml"], ["trainer.max_steps=100"])]
    assert key not in others and len(set(others)) == len(others)


def lodo_row(dataset, setting, val, test, wise, minilm, label=None):
    return {**row(dataset, setting, val, test, label), "minilm": {"recall@5": minilm}, "bm25": {"recall@5": 0.1},
            "variants": {"wise-0.5": {"recall@5": wise, "ndcg@5": wise}}, "train_queries": 10, "steps": 300}


def test_the_recipes_table_gives_each_recipe_at_its_own_val_chosen_alpha(general):
    ft = f"{TAT}, full fine-tune"
    rows = [lodo_row("toollens", TAT, {"1.0": 0.30, "0.5": 0.20}, 0.40, 0.10, 0.30),
            lodo_row("nestools", TAT, {}, 0.50, 0.90, 0.52),
            lodo_row("toollens", TAT, {"1.0": 0.30, "0.5": 0.40}, 0.10, 0.50, 0.30, "full fine-tune"),
            lodo_row("nestools", TAT, {}, 0.90, 0.60, 0.52, "full fine-tune"),
            lodo_row("toollens", TAT, {"1.0": 0.99}, 0.99, 0.99, 0.30, "rerun")]  # a rerun is no recipe
    table = general.recipes_table(rows)
    # TAT: val picks alpha 1.0 -> test 0.40 and 0.50, deltas +0.10 and -0.02
    assert f"| {TAT} | 2 | 0.5: 0.2000, 1.0: 0.3000 | 1.0 | 0.450 | 0.410 | +0.040 | -0.020 (nestools) |" in table
    # full fine-tune: val picks 0.5 -> test 0.50 and 0.60, deltas +0.20 and +0.08
    assert f"| {ft} | 2 | 0.5: 0.4000, 1.0: 0.3000 | 0.5 | 0.550 | 0.410 | +0.140 | +0.080 (nestools) |" in table
    assert "rerun" not in table
    per = general.recipe_rows_table([r for r in rows if r["setting"] == ft])
    assert "**0.5**" in per and "| nestools | 0.600 | 0.600 | 0.900 | 0.520 |" in per
    assert "| **mean of 2** | **0.550** | | | 0.410 | | **+0.140** |" in per


def test_an_edited_base_config_never_reuses_a_folder_trained_before(general, tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    base = tmp_path / "configs" / "general.yaml"
    base.write_text("model:\n  freeze_layers: 4\n")
    monkeypatch.setattr(general, "ROOT", tmp_path)
    before = general.model_key(["a"], None, [], [])
    assert general.model_key(["a"], None, [], []) == before
    base.write_text("model:\n  freeze_layers: 0\n")
    assert general.model_key(["a"], None, [], []) != before
    overlay = tmp_path / "configs" / "top2.yaml"
    overlay.write_text("optim:\n  lr: 2.0e-4\n")
    with_overlay = general.model_key(["a"], None, ["configs/top2.yaml"], [])
    overlay.write_text("optim:\n  lr: 1.0e-4\n")
    assert general.model_key(["a"], None, ["configs/top2.yaml"], []) != with_overlay


def test_unseen_datasets_are_test_only_ones_with_no_leak_and_no_near_duplicate(general):
    def main(dataset, dropped=None, dups=0):
        return {"method": "general_lodo", "setting": "zero-shot", "dataset": dataset, "leakage_dropped": dropped or {},
                "near_duplicates": {"queries": dups, "tools": 0}}
    rows = [main("seal-tools"), main("nestools", dups=1), main("toolbench-g1", {"toollens": {"tool": 3}}),
            main("toollens"),  # a training split: never unseen
            {**main("gorilla-tensorflow"), "setting": "zero-shot, test-only datasets train"}]
    assert general.unseen_datasets(rows) == ["seal-tools"]


def test_a_query_split_row_is_compared_with_the_same_models_without_the_split(general):
    split = {**row("toollens", TAT, {"1.0": 0.35}, 0.33, "sampler fix, query split clauses"), "query_split": "clauses"}
    rows = [row("toollens", TAT, {"1.0": 0.30}, 0.31),  # the main recipe: not the base of a split row
            row("toollens", TAT, {"1.0": 0.32}, 0.29, "sampler fix"), split]
    table = general.variants_table([r for r in rows if r["label"]], rows)
    assert ("| sampler fix, query split clauses | toollens | 0.3200 → 0.3500 | – | 0.2900 → 0.3300 "
            "| sampler fix without the split, same device | CPU, 2 threads |") in table
    assert "| sampler fix | toollens | 0.3000 → 0.3200 | – | 0.3100 → 0.2900 | main, same device |" in table


def test_a_query_split_rule_is_parsed_applied_and_a_bad_one_named(general):
    import argparse

    from toolgraph.retrieval.dense import DenseConfig

    assert general.split_rule("clauses") == ("clauses", 0.0, False)
    assert general.split_rule("sentences:0.3") == ("sentences", 0.3, False)
    assert general.split_rule("clauses:0.3+cover") == ("clauses", 0.3, True)
    assert general.split_rule("clauses+cover") == ("clauses", 0.0, True)
    for bad in ("words", "clauses:1.5", "clauses:x", "none:0.3", "none+cover", "clauses:0.3+first", "clauses+"):
        with pytest.raises(argparse.ArgumentTypeError, match=repr(bad).replace("+", r"\+")):
            general.split_rule(bad)

    class Member:
        config = DenseConfig(cache_dir=None)

    member = Member()
    general.apply_rule(member, "clauses:0.3")
    assert (member.config.query_split, member.config.query_split_whole) == ("clauses", 0.3)
    assert member.config.query_split_cover is False
    general.apply_rule(member, "clauses:0.3+cover")
    assert (member.config.query_split_whole, member.config.query_split_cover) == (0.3, True)


def test_an_adapted_row_is_compared_with_the_same_models_before_adaptation(general):
    """lodo --adapt: the rows' base is the labelled recipe they adapted (same models, same split rule), not
    the unlabelled main row."""
    top3 = "sampler fix, top 3 layers"
    adapted = f"{top3}, {general.ADAPTED}"
    rows = [row("toollens", TAT, {"1.0": 0.30}, 0.31),
            row("toollens", TAT, {"1.0": 0.33}, 0.32, top3),
            {**row("toollens", TAT, {"1.0": 0.35}, 0.33, adapted), "adapt": {"config": "configs/adapt_catalog.yaml"}},
            {**row("toollens", TAT, {"1.0": 0.40}, 0.41, f"{top3}, query split clauses:0.3"),
             "query_split": "clauses:0.3"},
            {**row("toollens", TAT, {"1.0": 0.42}, 0.40, f"{adapted}, query split clauses:0.3"),
             "query_split": "clauses:0.3", "adapt": {"config": "configs/adapt_catalog.yaml"}}]
    table = general.variants_table([r for r in rows if r.get("adapt")], rows)
    assert f"| {adapted} | toollens | 0.3300 → 0.3500 | – | 0.3200 → 0.3300 | {top3}, same device |" in table
    assert (f"| {adapted}, query split clauses:0.3 | toollens | 0.4000 → 0.4200 | – | 0.4100 → 0.4000 | "
            f"{top3}, query split clauses:0.3, same device |") in table


def test_a_second_encoder_row_is_compared_with_the_same_models_and_rule_without_it(general):
    """lodo --second: the base is the same labelled models under the same split rule, the encoder left out."""
    seed, cover = "seed 2", "query split clauses:0.3+cover"
    second = {"encoder": "all-mpnet-base-v2", "weight": 0.25}
    fused = f"{seed}, + 0.25 x all-mpnet-base-v2, {cover}"
    rows = [row("toollens", TAT, {"1.0": 0.30}, 0.31),
            {**row("toollens", TAT, {"1.0": 0.32}, 0.30, f"{seed}, {cover}"), "query_split": "clauses:0.3+cover"},
            {**row("toollens", TAT, {"1.0": 0.34}, 0.33, fused), "query_split": "clauses:0.3+cover", "second": second}]
    table = general.variants_table([rows[-1]], rows)
    assert (f"| {fused} | toollens | 0.3200 → 0.3400 | – | 0.3000 → 0.3300 | "
            f"{seed}, {cover} without all-mpnet-base-v2, same device |") in table


def test_a_second_encoder_names_the_rows_not_the_model_folder_and_needs_a_positive_weight(general, monkeypatch,
                                                                                         capsys):
    import argparse

    args = argparse.Namespace(label="seed 2", second="all-mpnet-base-v2", second_weight=0.25, adapt=None)
    assert general.rows_label(args) == "seed 2, + 0.25 x all-mpnet-base-v2"
    assert general.rows_label(argparse.Namespace(**{**vars(args), "second": None})) == "seed 2"
    assert general.rows_label(argparse.Namespace(**{**vars(args), "label": None, "adapt": "a.yaml"})) == \
        f"+ 0.25 x all-mpnet-base-v2, {general.ADAPTED}"
    for argv, said in ((["--second-weight", "0.5"], "--second-weight: give --second ENCODER too"),
                       (["--second", "all-mpnet-base-v2", "--second-weight", "0"], "0 is not above 0")):
        monkeypatch.setattr("sys.argv", ["general.py", "lodo", *argv])
        with pytest.raises(SystemExit):  # refused before any dataset or model is loaded
            general.main()
        assert said in capsys.readouterr().err


def test_an_unknown_second_encoder_is_named_before_any_fold_trains(general, monkeypatch):
    import argparse

    from toolgraph.errors import ModelNotFoundError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="'no-such-encoder-xyz' not found"):
        general.lodo(argparse.Namespace(second="no-such-encoder-xyz"))  # nothing else of args is read first
