"""The soak benchmark's logic (benchmarks/soak.py) in seconds: a tiny index, a few clients, swaps and
oversized queries — every count it reports adds up, and the server it measured stayed clean."""

import json

import pytest
from conftest import load_benchmark


@pytest.mark.slow  # about 20 s: a server process, a few seconds of load
def test_soak_smoke(tiny_dataset_dir, tiny_bert_dir, tmp_path, monkeypatch):
    soak = load_benchmark("soak", monkeypatch)
    retriever = {"name": "t2a", "scorer": "rrf",
                 "dense": {"name": "dense", "model": str(tiny_bert_dir), "cache_dir": None, "progress": False}}
    row = soak.main(["--minutes", "0.1", "--clients", "3", "--mcp-clients", "1", "--swap-every", "1.5",
                     "--big-every", "2.5", "--big-bytes", "200000", "--dataset", str(tiny_dataset_dir),
                     "--retriever", json.dumps(retriever), "--work", str(tmp_path / "work"), "--no-save"])
    m = row["metrics"]
    assert m["errors"] == 0, row["errors_sample"]
    assert m["served"] > 0 and m["served_by_route"].get("MCP search_tools", 0) > 0
    assert m["oversized_sent"] >= 2 and m["oversized_refused_413"] == m["oversized_sent"]
    assert m["swaps"] >= 3 and m["reloads"] >= 1 and m["reload_errors"] == 0 and m["server_alive"]
    assert m["files_written_by_server"] == 0 and m["rss_mb_start"] > 0 and m["fds_end"] > 0
    assert row["command"].startswith("python benchmarks/soak.py") and m["p50_ms"] <= m["p95_ms"] <= m["p99_ms"]
