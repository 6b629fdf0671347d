"""The query filter the adapters share (data/sources/_filter.py): check order and what it counts."""

from collections import Counter

import pytest

from toolgraph.data.sources._filter import QueryFilter, SkipReasons

REASONS = SkipReasons(empty_text="empty", no_tools="none", unknown_tool="unknown", repeated_tool="repeat",
                      dropped_tool="dropped", repeated_query="dup")


def test_reject_counts_the_first_failing_check_only():
    skipped = Counter()
    f = QueryFilter(REASONS, skipped)
    assert f.reject("  ", [], {"a"})  # blank text wins over no tools
    assert f.reject("q", [], {"a"})
    assert f.reject("q", ["a", "b"], {"a"})
    assert not f.reject("q", ["a", "a"], {"a"})
    assert skipped == Counter(empty=1, none=1, unknown=1)


def test_without_a_no_tools_reason_an_empty_list_passes():
    f = QueryFilter(SkipReasons(empty_text="empty", unknown_tool="unknown"), Counter())
    assert not f.reject("q", [], {"a"})


def test_gold_keeps_first_seen_order_and_counts_repeats_setting_the_key_at_zero():
    skipped = Counter()
    f = QueryFilter(REASONS, skipped)
    assert f.gold(["b", "a"]) == ("b", "a")
    assert list(skipped) == ["repeat"] and skipped["repeat"] == 0  # key order is part of the output
    assert f.gold(["b", "a", "b", "b"]) == ("b", "a") and skipped["repeat"] == 2


def test_resolve_drops_unresolved_and_counts_each_event_in_order():
    skipped = Counter()
    f = QueryFilter(REASONS, skipped)
    assert f.resolve(["a", "a", None, "b"]) == ("a", "b")
    assert list(skipped.items()) == [("repeat", 1), ("dropped", 1)]
    assert f.resolve([None]) == () and f.empty(())
    assert skipped == Counter(repeat=1, dropped=2, none=1)


def test_repeated_is_about_kept_queries_only():
    skipped = Counter()
    f = QueryFilter(REASONS, skipped)
    assert not f.repeated("q1")  # seen but not kept: not a repeat
    f.keep("q1")
    assert f.repeated("q1") and not f.repeated("q2")
    assert skipped == Counter(dup=1)


def test_a_check_without_a_reason_is_a_programming_error():
    f = QueryFilter(SkipReasons(empty_text="empty"), Counter())
    f.keep("x")
    with pytest.raises(ValueError, match="names no reason"):
        f.repeated("x")
    with pytest.raises(ValueError, match="repeated tools"):
        f.gold(["a"])
