"""The example catalog in examples/: it loads through the MCP reader, every label resolves, a bad label
line names its file and line, and the example evaluation configs run end to end."""

import json
from pathlib import Path

import pytest

from toolgraph.cli import main
from toolgraph.data import load_dataset
from toolgraph.errors import DataError
from toolgraph.sync import read_catalog_any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SERVERS = json.loads((EXAMPLES / "servers.json").read_text(encoding="utf-8"))
LABELS = [json.loads(line) for line in (EXAMPLES / "queries.jsonl").read_text(encoding="utf-8").splitlines()
          if line.strip()]


def example(**options):
    return load_dataset("mcp", EXAMPLES, servers="servers.json", **options)


def test_the_example_catalog_loads_with_every_server_and_tool():
    ds = example()
    assert [a.id for a in ds.agents] == [s["name"] for s in SERVERS] and 6 <= len(SERVERS) <= 8
    per_server = {s["name"]: [t["name"] for t in s["tools"]] for s in SERVERS}
    assert all(4 <= len(names) <= 8 for names in per_server.values())
    assert [t.id for t in ds.tools] == [f"{s}::{n}" for s, names in per_server.items() for n in names]
    assert len(ds.tools) == sum(map(len, per_server.values())) and not ds.skipped
    assert all(a.description and a.category for a in ds.agents)
    for t in ds.tools:  # a real JSON-Schema: an object whose properties say their type and what they are
        assert t.description and t.parameters["type"] == "object", t.id
        for name, prop in t.parameters["properties"].items():
            assert prop.get("type") and prop.get("description"), f"{t.id}: parameter {name}"
        assert set(t.parameters.get("required", [])) <= set(t.parameters["properties"]), t.id
    tools, agents = read_catalog_any(EXAMPLES / "servers.json")  # what `toolgraph index sync` reads
    assert [t.id for t in tools] == [t.id for t in ds.tools] and len(agents) == len(SERVERS)


def test_every_example_label_resolves_to_a_test_query():
    ds = example(queries="queries.jsonl")
    assert 20 <= len(LABELS) <= 30 and len(ds.queries) == len(LABELS)
    assert [q.id for q in ds.queries] == [rec["id"] for rec in LABELS]
    assert [q.tools for q in ds.queries] == [tuple(rec["tools"]) for rec in LABELS]  # written as server::tool ids
    assert {q.split for q in ds.queries} == {"test"} and not ds.skipped
    assert sum(len(q.tools) == 2 for q in ds.queries) >= 5  # some requests need two tools
    assert len({t for q in ds.queries for t in q.tools} & {t.id for t in ds.tools}) >= 25


GOOD = ['{"query": "will it rain in Oslo?", "tools": ["weather::get_forecast"]}',
        '{"query": "read notes.txt", "tools": ["read_file"], "id": "notes"}']


@pytest.mark.parametrize("bad,message", [
    ('{"query": "broken", "tools": [', "malformed JSON"),
    ('["weather::get_forecast"]', r'expected a JSON object \{"query": \.\.\., "tools": \[\.\.\.\]\}, got list'),
    ('{"tools": ["weather::get_forecast"]}', "missing or empty 'query'"),
    ('{"query": "   ", "tools": ["weather::get_forecast"]}', "missing or empty 'query'"),
    ('{"query": "rain?", "tools": []}', "'tools' must be a non-empty list"),
    ('{"query": "rain?", "tools": "weather::get_forecast"}', "'tools' must be a non-empty list"),
    ('{"query": "rain?", "tools": ["weather::get_forecast", ""]}', "'tools' must hold non-empty strings"),
    ('{"query": "rain?", "tools": ["weather::get_forcast"]}',
     r"tool 'weather::get_forcast' is not in the catalog; did you mean 'weather::get_forecast'\?"),
    ('{"query": "mail it", "tools": ["send_mail"]}', r"tool 'send_mail' is not in the catalog; did you mean 'email::send_email'\?"),
    ('{"query": "rain?", "tools": ["umbrella_finder"]}', r"tool 'umbrella_finder' is not in the catalog \(name"),
    ('{"query": "rain?", "tool": ["weather::get_forecast"]}', r"unknown key\(s\) \['tool'\]; a line holds query"),
    ('{"query": "rain?", "tools": ["weather::get_forecast"], "split": "dev"}', "'split' must be one of train, val"),
    ('{"query": "rain?", "tools": ["weather::get_forecast"], "id": null}', "'id' must be a non-empty string"),
    ('{"query": "rain?", "tools": ["weather::get_forecast"], "id": "notes"}', r"duplicate query id 'notes' \(first"),
])
def test_a_bad_label_line_names_the_file_and_the_line(tmp_path, bad, message):
    queries = tmp_path / "labels.jsonl"
    queries.write_text("\n".join([*GOOD, bad, GOOD[0]]) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=message) as e:
        example(queries=str(queries))  # the last line is good too: the whole file is refused, not read up to line 3
    assert str(e.value).startswith(f"{queries}:3: ") and e.value.line == 3


def test_bm25_evaluation_of_the_example_runs_through_evaluate(tmp_path, monkeypatch, capsys):
    """``python evaluate.py --config examples/eval_bm25.yaml --out ...`` from the repository root."""
    monkeypatch.chdir(ROOT)
    assert main(["evaluate", "--config", "examples/eval_bm25.yaml", "--out", str(tmp_path / "bm25")]) == 0
    assert "bm25 on mcp/test (28 queries)" in capsys.readouterr().out
    results = json.loads((tmp_path / "bm25" / "results.json").read_text())
    assert results["dataset"]["tools"] == 43 and results["dataset"]["queries"]["test"] == len(LABELS)
    assert 0.5 < results["metrics"]["recall@5"] <= 1.0  # 0.6071 when measured
    assert 0.5 < results["agent_metrics"]["recall@5"] <= 1.0  # servers: 0.8571


@pytest.mark.parametrize("config,encoder", [("eval_minilm.yaml", "retriever.encoder"),
                                            ("eval_t2a.yaml", "retriever.dense.encoder")])
def test_the_dense_example_configs_run_on_a_tiny_encoder(config, encoder, tiny_bert_dir, tmp_path, monkeypatch):
    """The MiniLM and t2a example configs, with a tiny random encoder in place of the real one."""
    monkeypatch.chdir(ROOT)
    out = tmp_path / config
    assert main(["evaluate", "--config", f"examples/{config}", f"{encoder}.name={tiny_bert_dir}",
                 f"{encoder}.cache_dir=null", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["dataset"]["queries"]["test"] == len(LABELS) and results["dataset"]["agents"] == len(SERVERS)
    assert 0.0 <= results["metrics"]["recall@5"] <= 1.0 and "recall@5" in results["agent_metrics"]
