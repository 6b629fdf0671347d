"""Committed figures: every results row says what it is and the command that made it, and the
README tables generated from a file agree with it."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULT_FILES = sorted(p for p in (ROOT / "benchmarks" / "results").glob("*.json") if p.name != "datasets.json")
KEY = ("method", "dataset", "split", "setting")


@pytest.mark.parametrize("path", RESULT_FILES, ids=[p.stem for p in RESULT_FILES])
def test_rows_have_the_documented_shape_and_a_command(path):
    rows = json.loads(path.read_text())["rows"]
    assert rows
    for r in rows:
        assert set(KEY) | {"metrics", "command"} <= set(r), (path.name, r.get("method"))
        assert r["command"].startswith("python ") and isinstance(r["metrics"], dict) and r["metrics"]
    keys = [tuple(r.get(k) for k in (*KEY, "encoder")) for r in rows]
    assert len(keys) == len(set(keys)), f"{path.name}: duplicate (method, dataset, split, setting, encoder)"


def test_usage_table_in_readme_is_generated_from_its_results_file():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from results_io import quality_table

    rows = json.loads((ROOT / "benchmarks/results/usage_rerank.json").read_text())["rows"]
    table = quality_table([r for r in rows if "recall@5" in r["metrics"]], extra=("training_steps", "seconds"))
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- usage:start -->\n(.*?)<!-- usage:end -->", readme, re.S).group(1)
    assert block.strip() == table.strip()


GENERATED_TABLES = {
    "tgr": ({}, {"tgr-discriminator", "tgr-retrieval", "tgr-graph"}),
    "inductive": ({"save": False}, {"inductive-main", "inductive-ablation", "inductive-kl", "inductive-timing"}),
    "agents": ({}, {"agents-main", "agents-variants", "agents-mcp-layout", "agents-serving"}),
}


@pytest.mark.parametrize("script", sorted(GENERATED_TABLES))
def test_readme_tables_are_generated_from_their_results_file(script, monkeypatch):
    import importlib

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    module = importlib.import_module(script)
    kwargs, markers = GENERATED_TABLES[script]
    written = {}
    monkeypatch.setattr(module, "write_readme_table", lambda marker, text: written.__setitem__(marker, text))
    module.render(**kwargs)
    readme = (ROOT / "README.md").read_text()
    assert set(written) == markers
    for marker, text in written.items():
        block = re.search(rf"<!-- {marker}:start -->\n(.*?)<!-- {marker}:end -->", readme, re.S).group(1)
        assert block.strip() == text.strip(), marker


def test_serving_rows_have_no_errors_and_sync_encodes_only_the_changed_tools():
    rows = json.loads((ROOT / "benchmarks/results/agents.json").read_text())["rows"]
    serve = [r for r in rows if r["method"] == "serve/search_tools"]
    assert serve and all(r["metrics"]["errors"] == 0 for r in serve)
    sync = next(r for r in rows if r["method"] == "serve/sync")["metrics"]
    assert sync["encoded"] == sync["changed_tools"] == 1000
