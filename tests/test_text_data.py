"""The contrastive batch sampler and collators."""

import random
from collections import Counter

import pytest

from toolgraph.data.text import ContrastiveBatchSampler, ContrastiveCollator, pad_gold


def _skewed_gold(n=2000, tools=100, seed=0):
    """One tool in ~20% of queries (like ToolLens' tool 75), 1-3 gold tools per query."""
    rng = random.Random(seed)
    gold = []
    for _ in range(n):
        g = set(rng.sample(range(1, tools), rng.randint(1, 3)))
        if rng.random() < 0.2:
            g.add(0)
        gold.append(sorted(g))
    return gold


def test_no_tool_twice_and_almost_every_query_used():
    gold = _skewed_gold()
    s = ContrastiveBatchSampler(gold, 32)
    plan = s.plan()
    assert all(len(b) == 32 for b in plan)
    assert all(len({t for _, t, _ in b}) == 32 for b in plan) and s.duplicates == 0
    used = [q for b in plan for q, _, _ in b]
    assert len(set(used)) == len(used) >= len(gold) - 32  # only the last incomplete batch is left
    assert all(t in gold[q] for b in plan for q, t, _ in b)


def test_popular_tool_is_still_a_positive_often():
    gold = _skewed_gold()
    counts = Counter(t for b in ContrastiveBatchSampler(gold, 32).plan() for _, t, _ in b)
    assert counts[0] >= 0.8 * len(ContrastiveBatchSampler(gold, 32).plan())  # ~once a batch


def test_deterministic_per_epoch_and_different_across_epochs():
    gold = _skewed_gold()
    a, b = ContrastiveBatchSampler(gold, 16, seed=1), ContrastiveBatchSampler(gold, 16, seed=1)
    assert a.plan() == b.plan()
    b.set_epoch(1)
    assert a.plan() != b.plan()


def test_ranks_get_disjoint_equal_shards_of_one_plan():
    gold = _skewed_gold(n=1000)
    full = ContrastiveBatchSampler(gold, 16).plan()
    shards = [ContrastiveBatchSampler(gold, 16, rank=r, world=3).plan() for r in range(3)]
    assert len({len(s) for s in shards}) == 1
    assert sorted(map(tuple, sum(shards, []))) == sorted(map(tuple, full[: len(shards[0]) * 3]))


def test_skip_resumes_mid_epoch_and_len_stays_the_epoch():
    gold = _skewed_gold(n=500)
    s = ContrastiveBatchSampler(gold, 16)
    full = list(s)
    s.skip = 5
    assert len(s) == len(full)
    assert list(s) == full[5:]
    assert list(s) == full  # skip applies once


def test_hard_negatives_drawn_in_the_plan():
    gold = [[0], [1], [2], [3]]
    hard = [[5], [6], [7], [8]]
    plan = ContrastiveBatchSampler(gold, 2, hard_negatives=hard).plan()
    assert all(h == q + 5 for b in plan for q, _, h in b)


def test_every_query_needs_gold():
    with pytest.raises(ValueError, match="at least one gold"):
        ContrastiveBatchSampler([[1], []], 2)


def test_collator_shapes(tiny_bert_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    coll = ContrastiveCollator(tok, ["find weather", "book a flight now please"], ["weather api", "flight api", "x"],
                               [[0], [1, 2]], 16, 16)
    batch = coll([(0, 0, 2), (1, 1, 0)])
    assert batch["query"]["input_ids"].shape[0] == 2 and batch["doc"]["input_ids"].shape[0] == 4
    assert batch["doc_tools"].tolist() == [0, 1, 2, 0] and batch["gold"].tolist() == [[0, -1], [1, 2]]
    # dynamic padding: the longest query sets the width, not max_length
    assert batch["query"]["input_ids"].shape[1] < 16
    assert pad_gold([[3], [1, 2, 4]]).tolist() == [[3, -1, -1], [1, 2, 4]]
