"""benchmarks/query_split.py: the split rule and BM25 weight are chosen on val, and each dataset's
leave-one-dataset-out column uses the rule the other datasets' val splits choose (hand-made rows)."""

import pytest
from conftest import load_benchmark


@pytest.fixture
def qs(monkeypatch):
    return load_benchmark("query_split", monkeypatch)


def row(dataset, val, test):
    """val / test: {split: {w: R@5}} for splits none, sentences, clauses and w "0.0", "0.3"."""
    return {"method": "query_split", "dataset": dataset, "dense": "all-MiniLM-L6-v2", "val_recall@5": val,
            "metrics": {s: {w: {"recall@5": v} for w, v in ws.items()} for s, ws in test.items()}}


def grid(none, sentences, clauses, bm25=0.0):
    return {"none": {"0.0": none, "0.3": none + bm25}, "sentences": {"0.0": sentences, "0.3": sentences + bm25},
            "clauses": {"0.0": clauses, "0.3": clauses + bm25}}


def test_the_rule_is_chosen_on_val_and_a_tie_keeps_the_simpler_one(qs):
    rows = [row("seal-tools", grid(0.5, 0.6, 0.7, 0.05), grid(0.5, 0.6, 0.7)),
            row("metatool", grid(0.8, 0.79, 0.79, -0.01), grid(0.8, 0.8, 0.8)),
            row("toolbench-g3", {}, grid(0.4, 0.45, 0.5))]  # no val split: never chooses
    (split, w), means = qs.choose(rows)
    assert (split, w) == ("clauses", "0.3")  # (0.75 + 0.78) / 2 beats every other rule's mean
    assert means[("none", "0.0")] == pytest.approx(0.65)
    tie = [row("metatool", grid(0.8, 0.8, 0.8), grid(0.8, 0.8, 0.8))]
    assert qs.choose(tie)[0] == ("none", "0.0")


def test_each_dataset_gets_the_rule_of_the_others_val_in_the_lodo_column(qs):
    rows = [row("seal-tools", grid(0.5, 0.6, 0.7), grid(0.5, 0.6, 0.7)),
            row("metatool", grid(0.8, 0.8, 0.8), grid(0.8, 0.81, 0.79))]
    table = "\n".join(qs.table(rows, "all-MiniLM-L6-v2"))
    # metatool's own val would tie (none); seal-tools alone chooses clauses, so metatool gets 0.79
    assert "| metatool | 0.800 | 0.790 | 0.790 | -0.010 |" in table and table.count("| clauses, w 0.0 | 0.790 |") == 1
    assert "| seal-tools | 0.500 | 0.700 | 0.700 | +0.200 |" in table and "| none, w 0.0 | 0.500 |" in table


def test_blended_rules_are_chosen_like_the_others_and_rows_without_them_are_compared_on_the_common_ones(qs):
    assert qs.rules((0.3,)) == ("none", "sentences", "clauses", "sentences:0.3", "clauses:0.3")
    blended = {**grid(0.5, 0.6, 0.7), "clauses:0.3": {"0.0": 0.72, "0.3": 0.72}}
    rows = [row("seal-tools", blended, blended), row("metatool", {**grid(0.8, 0.8, 0.8), "clauses:0.3": {
        "0.0": 0.81, "0.3": 0.81}}, {**grid(0.8, 0.8, 0.8), "clauses:0.3": {"0.0": 0.82, "0.3": 0.82}})]
    assert qs.choose(rows)[0] == ("clauses:0.3", "0.0")  # (0.72 + 0.81) / 2; a tie in w keeps 0.0
    assert "| metatool | 0.800 | 0.800 | 0.820 | +0.020 |" in "\n".join(qs.table(rows, "MiniLM"))
    old = row("api-bank", grid(0.6, 0.7, 0.7), grid(0.6, 0.7, 0.7))  # measured before the blended rules
    assert qs.common_rules([*rows, old]) == ["none", "sentences", "clauses"]
    assert "| api-bank | 0.600 | 0.700 | 0.700 |" in "\n".join(qs.table([*rows, old], "MiniLM"))


def test_rules_given_by_name_are_checked_and_must_include_the_tables_first_columns(qs, monkeypatch, capsys):
    assert qs.chosen_rules(None, (0.3,), False) == qs.rules((0.3,))
    given = ["none", "clauses", "clauses:0.3", "clauses:0.3+cover", "clauses"]
    assert qs.chosen_rules(given, (0.3,), False) == ("none", "clauses", "clauses:0.3", "clauses:0.3+cover")
    with pytest.raises(SystemExit, match="--rules: must include none"):
        qs.chosen_rules(["clauses", "clauses:0.3"], (0.3,), False)
    monkeypatch.setattr("sys.argv", ["query_split.py", "--rules", "none", "clauses", "clauses:2"])
    with pytest.raises(SystemExit):  # refused while parsing, before any dataset is loaded
        qs.main()
    assert "argument --rules: 'clauses:2': a query split is one of" in capsys.readouterr().err


def test_lodo_model_reads_the_adapted_encoder_when_the_row_was_adapted(monkeypatch, tmp_path):
    import json

    qs = load_benchmark("query_split", monkeypatch)
    fold, adapted = tmp_path / "lodo-1", tmp_path / "adapt-toollens-1"
    for f in (fold, adapted):
        (f / "retriever" / "encoder").mkdir(parents=True)
    row = {"method": "general_lodo", "dataset": "toollens", "run": str(fold), "val_recall@5": {"1.0": 0.3, "0.5": 0.4}}
    rows = [{**row, "setting": "zero-shot, top 3"},
            {**row, "setting": "zero-shot, top 3, adapted", "adapt": {"run": str(adapted)}},
            {**row, "setting": "zero-shot, mpnet", "encoder": "all-mpnet-base-v2"}]
    (tmp_path / "general.json").write_text(json.dumps({"rows": rows}))
    monkeypatch.setattr(qs, "RESULTS", tmp_path)
    assert qs.lodo_model("zero-shot, top 3", "toollens") == (fold / "retriever" / "encoder", 0.5, "all-MiniLM-L6-v2")
    assert qs.lodo_model("zero-shot, top 3, adapted", "toollens", 1.0) == (adapted / "retriever" / "encoder", None,
                                                                          "all-MiniLM-L6-v2")
    assert qs.lodo_model("zero-shot, mpnet", "toollens")[2] == "all-mpnet-base-v2"  # WiSE goes towards its own start


def test_a_second_encoder_gets_its_own_label_and_needs_naming(qs, monkeypatch, capsys):
    assert qs.dense_label(None, None) == "all-MiniLM-L6-v2"
    assert qs.dense_label("zero-shot, top 3", 0.5) == "zero-shot, top 3, WiSE 0.5"
    assert qs.dense_label("zero-shot, top 3", 0.5, "all-mpnet-base-v2", 0.5) == \
        "zero-shot, top 3, WiSE 0.5 + 0.5 x all-mpnet-base-v2"
    assert qs.dense_label(None, None, "all-mpnet-base-v2", 1.0) == "all-MiniLM-L6-v2 + 1 x all-mpnet-base-v2"
    monkeypatch.setattr("sys.argv", ["query_split.py", "--second-weights", "0.5"])
    with pytest.raises(SystemExit):  # refused before any dataset is loaded
        qs.main()
    assert "--second-weights: give --second ENCODER too" in capsys.readouterr().err
    monkeypatch.setattr("sys.argv", ["query_split.py", "--second", "all-mpnet-base-v2", "--second-weights", "0", "-1"])
    with pytest.raises(SystemExit):
        qs.main()
    assert "has a negative weight" in capsys.readouterr().err


def test_the_second_member_adds_its_min_max_scores_at_its_weight(qs):
    import torch

    from toolgraph.data.schema import Tool
    from toolgraph.retrieval.base import Retriever

    class Fixed(Retriever):  # scores fixed by hand: [Q, N]
        name = "fixed"

        def __init__(self, scores):
            super().__init__()
            self.scores = torch.tensor(scores)

        def index(self, tools):
            self.tools = list(tools)

        def score(self, queries):
            return self.scores[: len(queries)]

    tools = [Tool(id=f"t{i}", name=f"t{i}", description="") for i in range(3)]
    fused = qs.with_second(Fixed([[0.9, 0.5, 0.1]]), Fixed([[0.0, 10.0, 5.0]]), 0.5)
    fused.index(tools)
    # min-max: dense [1, 0.5, 0], second [0, 1, 0.5]; 1.0 x dense + 0.5 x second
    assert fused.score(["q"])[0].tolist() == pytest.approx([1.0, 1.0, 0.25])


def test_rows_measured_with_fewer_bm25_weights_are_compared_on_the_common_ones(qs):
    full = grid(0.5, 0.6, 0.7, 0.05)
    for ws in full.values():
        ws["0.5"] = ws["0.0"] + 0.2  # only the first run measured w 0.5
    rows = [row("seal-tools", full, full), row("metatool", grid(0.8, 0.8, 0.8), grid(0.8, 0.8, 0.8)),
            row("toolbench-g3", {}, grid(0.4, 0.45, 0.5))]
    assert qs.choose(rows)[0] == ("clauses", "0.3")  # 0.5 is not in metatool's row: not a candidate
    table = "\n".join(qs.table(rows, "MiniLM"))
    assert "none 0.6500 (w 0.3 0.6750)" in table and "with BM25 **clauses, w 0.3**" in table  # w 0.5: seal-tools only
