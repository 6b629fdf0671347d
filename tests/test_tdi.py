"""TDI pair data: labels, tool-disjoint test, balanced pretraining, negatives, files and errors."""

import json
from collections import Counter

import pytest

from toolgraph.data import load_dataset
from toolgraph.data.tdi import (
    LABELS,
    LINK_QUERY_PREFIX,
    TDIConfig,
    build_tdi,
    links_dataset,
    read_pairs,
    read_tdi,
    reverse,
    write_tdi,
)
from toolgraph.errors import ConfigError, DataError


def _cfg(folder, **kw):
    return TDIConfig(sources=[{"dataset": str(folder)}], test_fraction=0.25, val_fraction=0.2, **kw)


def _edges(pairs):
    """(needer, needed) of the dependency pairs, whatever their orientation."""
    out = set()
    for p in pairs:
        if p.label == "a_needs_b":
            out.add((p.tool_a, p.tool_b))
        elif p.label == "b_needs_a":
            out.add((p.tool_b, p.tool_a))
    return out


def test_labels_follow_the_dependencies_in_both_orientations(dependency_dataset_dir):
    tdi = build_tdi(_cfg(dependency_dataset_dir))
    name = load_dataset(str(dependency_dataset_dir)).name
    gold = {(f"{name}:do_{w}", f"{name}:login_{w}") for w in
            ["bank", "mail", "shop", "music", "drive", "photo", "chat", "bike", "cloud", "game", "tax", "vote",
             "ticket", "health", "school", "garden"]}
    found = set()
    for set_name in ("finetune", "val", "test"):
        edges = _edges(tdi.pairs[set_name])
        assert edges <= gold  # never a reversed or invented dependency
        found |= edges
        labels = Counter(p.label for p in tdi.pairs[set_name] if p.label != "none")
        if set_name == "finetune":  # random orientation: both dependency classes occur
            assert labels["a_needs_b"] > 0 and labels["b_needs_a"] > 0
    assert found == gold  # each component is a single edge: nothing crosses the split


def test_test_set_shares_no_tool_with_training(dependency_dataset_dir):
    tdi = build_tdi(_cfg(dependency_dataset_dir))
    train = tdi.tools_of("pretrain") | tdi.tools_of("finetune") | tdi.tools_of("val")
    assert tdi.pairs["test"] and not (tdi.tools_of("test") & train)


def test_pretrain_is_balanced_and_reverses_each_edge(dependency_dataset_dir):
    tdi = build_tdi(_cfg(dependency_dataset_dir))
    counts = Counter(p.label for p in tdi.pairs["pretrain"])
    assert counts["a_needs_b"] == counts["b_needs_a"] == counts["none"]
    pre = {(p.tool_a, p.tool_b, p.label) for p in tdi.pairs["pretrain"]}
    for p in tdi.pairs["finetune"]:
        if p.label != "none":
            r = reverse(p)
            assert (p.tool_a, p.tool_b, p.label) in pre and (r.tool_a, r.tool_b, r.label) in pre
    # the held-out validation pairs are in neither training set
    val = {frozenset((p.tool_a, p.tool_b)) for p in tdi.pairs["val"]}
    assert not val & {frozenset((p.tool_a, p.tool_b)) for p in tdi.pairs["pretrain"] + tdi.pairs["finetune"]}


def test_finetune_keeps_the_real_ratio_and_negatives_are_never_dependencies(dependency_dataset_dir):
    tdi = build_tdi(_cfg(dependency_dataset_dir, hard_negatives=2, easy_negatives=1))
    for sets in (("finetune", "val"), ("test",)):  # val is a stratified 20 % of the finetuning pairs
        c = Counter(p.label for s in sets for p in tdi.pairs[s])
        assert c["none"] == 3 * (c["a_needs_b"] + c["b_needs_a"])
    known = {frozenset(e) for s in ("finetune", "val", "test") for e in _edges(tdi.pairs[s])}
    negatives = [p for s in tdi.pairs.values() for p in s if p.label == "none"]
    assert not {frozenset((p.tool_a, p.tool_b)) for p in negatives} & known
    assert {p.kind for p in negatives} == {"hard", "easy"}


def test_build_is_deterministic_and_seeded(dependency_dataset_dir):
    a, b = build_tdi(_cfg(dependency_dataset_dir)), build_tdi(_cfg(dependency_dataset_dir))
    assert a.pairs == b.pairs
    assert build_tdi(_cfg(dependency_dataset_dir, seed=1)).pairs != a.pairs


def test_flagged_source_is_weighted_and_kept_out_of_test(dependency_dataset_dir):
    cfg = TDIConfig(sources=[{"dataset": str(dependency_dataset_dir), "weight": 0.5, "flag": "order", "test": False}])
    tdi = build_tdi(cfg)
    assert not tdi.pairs["test"]
    assert {p.weight for p in tdi.pairs["finetune"]} == {0.5}
    assert {p.kind for p in tdi.pairs["finetune"] if p.label != "none"} == {"order"}


def test_bad_source_spec_names_the_key():
    with pytest.raises(ConfigError, match=r"tdi.sources\[0\].*wieght"):
        build_tdi(TDIConfig(sources=[{"dataset": "x", "wieght": 1}]))


def test_write_read_roundtrip_and_counts(dependency_dataset_dir, tmp_path):
    tdi = build_tdi(_cfg(dependency_dataset_dir))
    write_tdi(tdi, tmp_path / "tdi")
    back = read_tdi(tmp_path / "tdi")
    assert back.pairs == tdi.pairs
    row = json.loads((tmp_path / "tdi" / "test.jsonl").read_text().splitlines()[0])
    assert set(row) >= {"tool_a", "tool_b", "label", "doc_a", "doc_b"} and row["doc_a"] == tdi.documents[row["tool_a"]]
    stats = json.loads((tmp_path / "tdi" / "stats.json").read_text())
    assert stats["counts"]["finetune"]["total"] == len(tdi.pairs["finetune"])
    assert set(stats["counts"]["finetune"]["per_class"]) == set(LABELS)


@pytest.mark.parametrize("row, message", [
    ({"tool_a": "a", "tool_b": "b", "label": "depends", "doc_a": "x", "doc_b": "y"}, "label 'depends'"),
    ({"tool_a": "a", "tool_b": "b", "label": "none", "doc_a": "x"}, "'doc_b'"),
    ({"tool_a": "a", "tool_b": "a", "label": "none", "doc_a": "x", "doc_b": "x"}, "paired with itself"),
    ({"tool_a": "a", "tool_b": "b", "label": "none", "doc_a": "x", "doc_b": "y", "weight": 0}, "weight"),
])
def test_bad_pair_lines_name_file_and_line(tmp_path, row, message):
    good = {"tool_a": "a", "tool_b": "c", "label": "none", "doc_a": "x", "doc_b": "z"}
    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=rf"test.jsonl:2: .*{message}"):
        read_pairs(path)


def test_a_tool_with_two_documents_is_an_error(tmp_path):
    path = tmp_path / "val.jsonl"
    rows = [{"tool_a": "a", "tool_b": "b", "label": "none", "doc_a": "x", "doc_b": "y"},
            {"tool_a": "a", "tool_b": "c", "label": "none", "doc_a": "other", "doc_b": "y"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match="val.jsonl:2: .*two different documents"):
        read_pairs(path)


def test_links_dataset_turns_edges_into_queries(dependency_dataset_dir):
    tdi = build_tdi(_cfg(dependency_dataset_dir))
    ds = links_dataset(tdi)
    assert {t.id for t in ds.tools} == set(tdi.documents)
    assert {t.id: t.document() for t in ds.tools} == tdi.documents  # documents survive the round trip
    for q in ds.queries:
        needer = q.id.split(":", 1)[1]
        assert q.text == LINK_QUERY_PREFIX + tdi.documents[needer]
        assert all(t.endswith(needer.split(":do_")[1]) for t in q.tools)
    assert {q.split for q in ds.queries} == {"train", "val", "test"}


def test_real_sources_build_with_counts(data_root):
    """The default sources on the shared datasets: every class present, test tool-disjoint."""
    tdi = build_tdi(TDIConfig(tool_text="io"), data_root)
    counts = tdi.counts()
    for name in ("pretrain", "finetune", "val", "test"):
        assert all(counts[name]["per_class"][lab] > 100 for lab in LABELS), (name, counts[name])
    assert {"toollinkos", "nestools", "seal-tools", "api-bank"} <= set(counts["test"]["per_source"])
    assert "ultratool" not in counts["test"]["per_source"]  # flagged: order links, train only
    train = tdi.tools_of("pretrain") | tdi.tools_of("finetune") | tdi.tools_of("val")
    assert not tdi.tools_of("test") & train


def test_cli_tdi_build_prints_counts_per_class_and_source(dependency_dataset_dir, tmp_path, capsys):
    from toolgraph.cli import main

    src = f"sources=[{{dataset: {dependency_dataset_dir}}}]"
    assert main(["data", "tdi", "build", str(tmp_path / "out"), src, "test_fraction=0.25", "seed=3"]) == 0
    out = capsys.readouterr().out
    name = load_dataset(str(dependency_dataset_dir)).name
    assert "pretrain" in out and "finetune" in out and "test" in out and f"    {name}" in out
    assert "a_needs_b" in out and "b_needs_a" in out
    assert json.loads((tmp_path / "out" / "stats.json").read_text())["config"]["seed"] == 3
    assert main(["data", "tdi", "build", str(tmp_path / "x"), "hard_negativs=2"]) == 2
    assert "hard_negativs" in capsys.readouterr().err


def test_links_dataset_options_are_checked(data_root):
    with pytest.raises(ConfigError, match="unknown option.*tdi-links"):
        load_dataset("tdi-links", data_root, negatives=2)
