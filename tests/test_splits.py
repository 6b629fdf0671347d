from collections import Counter

import pytest

from toolgraph.data.schema import Query, Tool, ToolDataset
from toolgraph.data.splits import (
    carve_val,
    crossfit,
    crossfit_folds,
    inductive,
    inject_noise,
    seeded_assign,
    transductive,
)
from toolgraph.errors import DataError


def _dataset(n_tools=20, n_train=200, n_test=50):
    tools = [Tool(str(i), f"tool{i}", f"does {i}") for i in range(n_tools)]
    qs = []
    for i in range(n_train + n_test):
        split = "train" if i < n_train else "test"
        qs.append(Query(f"q{i}", f"query {i}", (str(i % n_tools), str((i * 7 + 3) % n_tools)), split))
    return ToolDataset("synthetic", tools, qs)


def test_seeded_assign_is_deterministic_and_order_free():
    ids = [f"q{i}" for i in range(100)]
    a = seeded_assign(ids, {"test": 0.2, "train": 0.8}, seed=3)
    b = seeded_assign(list(reversed(ids)), {"test": 0.2, "train": 0.8}, seed=3)
    assert a == b and Counter(a.values()) == {"test": 20, "train": 80}
    assert a != seeded_assign(ids, {"test": 0.2, "train": 0.8}, seed=4)


def test_carve_val_moves_only_train():
    ds = _dataset()
    qs = carve_val(ds.queries, 0.1, seed=0)
    c = Counter(q.split for q in qs)
    assert c == {"train": 180, "val": 20, "test": 50}
    assert [q.id for q in qs if q.split == "test"] == [q.id for q in ds.split("test")]


def test_carve_val_from_test_keeps_train_and_disjoint_ids():
    ds = _dataset()
    qs = carve_val(ds.queries, 0.3, seed=0, source="test")
    c = Counter(q.split for q in qs)
    assert c == {"train": 200, "val": 15, "test": 35}
    val, test = {q.id for q in qs if q.split == "val"}, {q.id for q in qs if q.split == "test"}
    assert val | test == {q.id for q in ds.split("test")} and not val & test
    assert carve_val(ds.queries, 0.3, seed=0, source="test") == qs  # seeded
    with pytest.raises(DataError, match="'dev'"):
        carve_val(ds.queries, 0.3, seed=0, source="dev")


def test_transductive_drops_queries_with_unseen_tools_and_counts_them():
    tools = [Tool(x, x, x) for x in "abc"]
    qs = [Query("1", "t", ("a",), "train"), Query("2", "t", ("a",), "test"), Query("3", "t", ("a", "c"), "test")]
    out = transductive(ToolDataset("d", tools, qs))
    assert [q.id for q in out.queries] == ["1", "2"]
    assert sum(out.skipped.values()) == 1


def test_inductive_keeps_test_identical_across_ratios():
    ds = _dataset()
    tests = []
    for ratio in (0.1, 0.2, 0.3):
        out, unseen = inductive(ds, ratio, seed=0)
        tests.append([q.id for q in out.split("test")])
        assert unseen and not any(set(q.tools) & set(unseen) for q in out.split("train"))
        dropped = len(ds.split("train")) - len(out.split("train"))
        assert sum(out.skipped.values()) == dropped > 0
    assert tests[0] == tests[1] == tests[2] == [q.id for q in ds.split("test")]
    # larger ratios hide a superset of tools (same seed)
    assert set(inductive(ds, 0.1, 0)[1]) <= set(inductive(ds, 0.3, 0)[1])


def test_noise_replaces_the_requested_share_of_train_labels():
    ds = _dataset()
    out = inject_noise(ds, 0.1, seed=0)
    before = {q.id: q.tools for q in ds.queries}
    changed = sum(a != b for q in out.queries for a, b in zip(q.tools, before[q.id]))
    assert changed == out.notes["noisy_labels"] == 40  # 10 % of 400 train labels
    assert all(q.tools == before[q.id] for q in out.split("test"))
    assert all(len(set(q.tools)) == len(q.tools) for q in out.queries)


def test_crossfit_drops_one_fold_of_train_and_the_folds_partition_it():
    ds = _dataset()
    folds = crossfit_folds(ds, 3, seed=0)
    assert set(folds) == {q.id for q in ds.split("train")} and sorted(Counter(folds.values()).values()) == [66, 67, 67]
    kept = set()
    for i in range(3):
        out = crossfit(ds, 3, i, seed=0)
        train = {q.id for q in out.split("train")}
        assert not any(folds[q] == i for q in train) and len(train) == 200 - list(folds.values()).count(i)
        assert [q.id for q in out.split("test")] == [q.id for q in ds.split("test")]
        assert sum(out.skipped.values()) == 200 - len(train) and out.notes["setting"] == f"crossfit-3-{i}"
        kept |= set(folds) - train
    assert kept == set(folds)  # every training query is held out by exactly one fold
    assert crossfit_folds(ds, 3, seed=1) != folds
    with pytest.raises(DataError, match="fold must be in"):
        crossfit(ds, 3, 3)
    with pytest.raises(DataError, match="k >= 2"):
        crossfit_folds(ds, 1)
