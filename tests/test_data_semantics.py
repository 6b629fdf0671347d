"""Issue 20, finding 11 (data) and Build 6: what a reader does with repeated gold ids, repeated query
ids, a ``steps`` string, bytes that are not UTF-8 and JSON no parser can hold. Every refusal is a
DataError naming the file and the line (or the byte offset); ``on_duplicate`` keeps one copy on
request and counts it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from toolgraph import metrics
from toolgraph.config import TextDataConfig
from toolgraph.data import load_dataset
from toolgraph.data.formats import iter_jsonl, read_dataset, read_json, read_object_counting_repeats, read_tsv
from toolgraph.data.schema import Query
from toolgraph.data.text import ToolTextDataModule
from toolgraph.errors import ConfigError, DataError

TOOLS = [{"id": t, "name": f"tool {t}", "description": f"does {t}"} for t in ("a", "b", "c", "d", "e", "f")]


def write(folder: Path, queries: list[dict | str], tools: list[dict] = TOOLS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tools.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tools))
    (folder / "queries.jsonl").write_text("".join((q if isinstance(q, str) else json.dumps(q)) + "\n" for q in queries))
    return folder


# ---- duplicate gold ids: counted once, the same in training and in evaluation ----------------------
class _Tokenizer:
    """Enough of a tokenizer for QueryCollator (the gold tensors are what this test reads)."""

    def __call__(self, texts, **kw):
        return {"input_ids": torch.zeros(len(texts), 2, dtype=torch.long),
                "attention_mask": torch.ones(len(texts), 2, dtype=torch.long)}


def test_repeated_gold_id_counts_once_in_training_metrics_and_in_evaluate(tmp_path):
    folder = write(tmp_path / "ds", [
        {"id": "q1", "text": "first", "tools": ["a", "a", "b"], "split": "val"},
        {"id": "q2", "text": "second", "tools": ["c", "d", "c", "c"], "split": "val"},
        {"id": "q3", "text": "third", "tools": ["e"], "split": "train"}])
    ds = read_dataset(folder)
    q = {q.id: q for q in ds.queries}
    assert q["q1"].tools == ("a", "b") and q["q2"].tools == ("c", "d")  # once each, source order
    assert ds.notes["repeated_gold_ids"] == 3
    assert ds.stats()["max_labels_per_query"] == 2

    # evaluate: rankings of ids against gold id sets
    rankings = [["a", "c", "e", "b", "f"], ["f", "c", "e", "a", "b"]]
    expected = metrics.compute(rankings, [q["q1"].tools, q["q2"].tools], ks=[1, 3, 5])

    # training: the val datamodule's gold index tensors, scored the way RetrievalTask._eval_step does
    dm = ToolTextDataModule(ds, TextDataConfig(), _Tokenizer())
    batch = next(iter(dm.val_dataloader()))
    order = [{"first": 0, "second": 1}[t] for t in batch["texts"]]
    idx = torch.tensor([[dm.tool_index[t] for t in rankings[i]] for i in order])
    gold = batch["gold"]
    hits = (idx.unsqueeze(2) == gold.unsqueeze(1)).any(2)
    assert (gold >= 0).sum(1).tolist() == [2, 2]  # not 3 and 4
    metric = metrics.RetrievalMetrics(ks=[1, 3, 5])
    metric.update(hits, (gold >= 0).sum(1))
    got = {k: float(v) for k, v in metric.compute().items()}
    for name in ("recall@1", "recall@3", "recall@5", "precision@3", "ndcg@5", "map@5"):
        assert got[name] == pytest.approx(expected[name]), name
    assert got["recall@5"] == pytest.approx(0.75)  # q1 finds a and b (1.0), q2 finds c only (0.5)


def test_query_holds_each_gold_id_once_wherever_it_is_built():
    q = Query("q", "text", ("x", "y", "x"), "test", ["s1", "s2"])
    assert q.tools == ("x", "y") and q.steps == ("s1", "s2")
    with pytest.raises(DataError, match="not one string"):
        Query("q", "text", "abc")


# ---- duplicate query ids ------------------------------------------------------------------------
def test_duplicate_query_id_is_an_error_naming_both_lines(tmp_path):
    folder = write(tmp_path / "ds", [
        {"id": "q1", "text": "first copy", "tools": ["a"]},
        {"id": "q2", "text": "other", "tools": ["b"]},
        {"id": "q1", "text": "second copy", "tools": ["c"]}])
    with pytest.raises(DataError, match=r"queries.jsonl:3: duplicate query id 'q1' \(first on line 1\).*keep-first"):
        read_dataset(folder)


def test_on_duplicate_keeps_one_copy_and_counts_it(tmp_path):
    folder = write(tmp_path / "ds", [
        {"id": "q1", "text": "first copy", "tools": ["a"]},
        {"id": "q2", "text": "other", "tools": ["b"]},
        {"id": "q1", "text": "second copy", "tools": ["c"]}])
    first = read_dataset(folder, on_duplicate="keep-first")
    assert [(q.id, q.text) for q in first.queries] == [("q1", "first copy"), ("q2", "other")]
    assert first.skipped == {"repeated query id (first kept)": 1}
    last = load_dataset(str(folder), on_duplicate="keep-last")  # a JSONL folder takes this one option
    assert [(q.id, q.text, q.tools) for q in last.queries] == [("q1", "second copy", ("c",)), ("q2", "other", ("b",))]
    assert last.skipped == {"repeated query id (last kept)": 1}
    with pytest.raises(ConfigError, match="on_duplicate: 'last' is not one of error, keep-first, keep-last"):
        read_dataset(folder, on_duplicate="last")
    with pytest.raises(ConfigError, match=r"data.options: \['val_fraction'\].*takes only on_duplicate"):
        load_dataset(str(folder), val_fraction=0.1)


def test_beir_duplicate_query_id_is_an_error_unless_told(tmp_path):
    folder = tmp_path / "beir"
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text('{"_id": "d1", "text": "weather"}\n{"_id": "d2", "text": "flights"}\n')
    (folder / "queries.jsonl").write_text('{"_id": "1", "text": "rain?"}\n{"_id": 1, "text": "fly to Rome"}\n')
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n1\td2\t1\n")
    with pytest.raises(DataError, match=r"queries.jsonl:2: duplicate query _id '1' \(first on line 1\)"):
        load_dataset("beir", tmp_path, path="beir")
    ds = load_dataset("beir", tmp_path, path="beir", on_duplicate="keep-last")
    assert [(q.text, q.tools) for q in ds.queries] == [("fly to Rome", ("d2",))]
    assert ds.skipped["repeated query _id (last kept)"] == 1
    (folder / "corpus.jsonl").write_text('{"_id": "d1", "text": "weather"}\n{"_id": "d1", "text": "again"}\n')
    with pytest.raises(DataError, match=r"corpus.jsonl:2: duplicate corpus id 'd1' \(first on line 1\)"):
        load_dataset("beir", tmp_path, path="beir", on_duplicate="keep-first")


# ---- steps and tools must be lists of strings -----------------------------------------------------
@pytest.mark.parametrize("field,value,match", [
    ("steps", "abc", r"field 'steps' must be list"),
    ("steps", ["find it", 3], r"field 'steps'\[1\] must be a non-empty string"),
    ("tools", "a", r"field 'tools' must be list"),
    ("tools", [["a"]], r"field 'tools'\[0\] must be a non-empty string"),
    ("split", ["test"], r"field 'split' must be str"),
])
def test_list_fields_must_hold_strings(tmp_path, field, value, match):
    folder = write(tmp_path / "ds", [{"id": "q0", "text": "fine", "tools": ["a"]},
                                     {"id": "q1", "text": "t", "tools": ["a"], field: value}])
    with pytest.raises(DataError, match=match) as e:
        read_dataset(folder)
    assert f"{folder / 'queries.jsonl'}:2:" in str(e.value)


def test_steps_list_is_kept_whole(tmp_path):
    folder = write(tmp_path / "ds", [{"id": "q1", "text": "t", "tools": ["a"], "steps": ["abc", "def"]}])
    assert read_dataset(folder).queries[0].steps == ("abc", "def")


# ---- bytes that are not UTF-8, JSON no parser can hold -----------------------------------------
def _bad_utf8(path: Path) -> Path:
    path.write_bytes(b'{"id": "x"}\n{"id": "caf\xe9"}\n')  # Latin-1 e-acute at byte 23, line 2
    return path


@pytest.mark.parametrize("reader", [
    lambda p: list(iter_jsonl(p)), read_json, lambda p: read_object_counting_repeats(p),
    lambda p: list(read_tsv(p)),
])
def test_non_utf8_input_names_the_file_and_byte_offset(tmp_path, reader):
    path = _bad_utf8(tmp_path / "data.jsonl")
    with pytest.raises(DataError, match=r"data.jsonl:2: not valid UTF-8 at byte offset 23 \(byte 0xe9"):
        reader(path)


def test_non_utf8_dataset_file_is_named(tmp_path):
    folder = write(tmp_path / "ds", [{"id": "q1", "text": "t", "tools": ["a"]}])
    with (folder / "queries.jsonl").open("ab") as f:
        f.write(b'{"id": "q2", "text": "\xff", "tools": ["a"]}\n')
    with pytest.raises(DataError, match=r"queries.jsonl:2: not valid UTF-8 at byte offset \d+ \(byte 0xff"):
        read_dataset(folder)


def test_metatool_csv_not_utf8_is_a_data_error(tmp_path):
    from toolgraph.data.sources.metatool import _csv_rows

    path = tmp_path / "all_clean_data.csv"
    path.write_bytes(b"Query,Tool\nsome query,\x81tool\n")
    with pytest.raises(DataError, match=r"all_clean_data.csv:2: not valid UTF-8 at byte offset 22"):
        _csv_rows(path)


@pytest.mark.parametrize("text,match", [
    ("[" * 100_000, "JSON nested too deeply"),
    ('{"id": ' + "1" * 5000 + "}", "unreadable JSON value"),
])
def test_json_no_parser_can_hold_is_a_data_error(tmp_path, text, match):
    path = tmp_path / "x.jsonl"
    path.write_text('{"ok": 1}\n' + text + "\n")
    with pytest.raises(DataError, match=f"x.jsonl:2: {match}"):
        list(iter_jsonl(path))


def test_lone_surrogate_is_refused_before_it_breaks_a_write(tmp_path):
    folder = write(tmp_path / "ds", ['{"id": "q1", "text": "bad \\ud800 text", "tools": ["a"]}'])
    with pytest.raises(DataError, match=r"queries.jsonl:1: field 'text' holds a lone surrogate"):
        read_dataset(folder)


def test_index_sync_reads_a_catalog_with_the_same_rule(tmp_path):
    from conftest import MCP_SERVERS, write_mcp_catalog

    from toolgraph.cli import build_parser
    from toolgraph.sync import read_catalog_any

    servers = [dict(MCP_SERVERS[0], tools=[{"name": "get_forecast"}, {"name": "get_forecast", "description": "2"}])]
    catalog, _ = write_mcp_catalog(tmp_path, servers, [])
    with pytest.raises(DataError, match=r"duplicate tool inside a server 'weather-server::get_forecast'.*--on-duplicate"):
        read_catalog_any(catalog)
    tools, _ = read_catalog_any(catalog, on_duplicate="keep-last")
    assert [(t.id, t.description) for t in tools] == [("weather-server::get_forecast", "2")]
    args = build_parser().parse_args(["index", "sync", str(catalog), "--index", "x", "--on-duplicate", "keep-first"])
    assert args.on_duplicate == "keep-first"
