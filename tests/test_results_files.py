"""Committed figures: every results row says what it is and the command that made it, and every
generated table (README.md and docs/*.md, between <!-- name:start --> and <!-- name:end -->) equals
what its benchmarks/ render step writes from the results files."""

import json
import re
from pathlib import Path

import pytest
from conftest import load_benchmark

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


# script in benchmarks/ -> (render kwargs, the page its blocks live on, the blocks it writes)
GENERATED = {
    "headline": ({}, "README.md", {"headline"}),
    "datasets": ({}, "docs/data.md", {"datasets"}),
    "baselines": ({}, "docs/results.md", {"baselines"}),
    "speed": ({}, "docs/results.md", {"speed"}),
    "training_results": ({}, "docs/results.md", {"training"}),
    "train_step": ({}, "docs/results.md", {"trainstep"}),
    "usage_rerank": ({}, "docs/usage-and-rerank.md", {"usage", "usage-speed"}),
    "tgr": ({}, "docs/dependencies.md", {"tgr-discriminator", "tgr-retrieval", "tgr-graph"}),
    "inductive": ({"save": False}, "docs/graph.md",
                  {"inductive-main", "inductive-ablation", "inductive-kl", "inductive-timing"}),
    "agents": ({}, "docs/agents-and-serving.md", {"agents-main", "agents-variants", "agents-mcp-layout", "agents-serving"}),
    "soak": ({}, "docs/agents-and-serving.md", {"serve-soak"}),
    "serve_bench": ({}, "docs/agents-and-serving.md", {"serve-startup"}),
    "sweep_bench": ({}, "docs/configuration.md", {"sweep-bench"}),
    "feedback_bench": ({}, "docs/agents-and-serving.md", {"feedback-replay"}),
    "scale_bench": ({}, "docs/agents-and-serving.md", {"scale"}),
    "convergence": ({}, "docs/dense.md", {"fast"}),
    "general": ({}, "docs/general.md", {"general-lodo", "general-all", "general-mcp", "general-test-as-train",
                        "general-variants", "general-recipes", "general-full-finetune", "general-encoders"}),
    "general_hybrid": ({}, "docs/general.md", {"general-hybrid", "general-hybrid-tat", "general-hybrid-self-supervised", "general-hybrid-full-finetune",
                                             "general-hybrid-full-finetune-lr6e-5", "general-hybrid-bm25-fusion"}),
    "query_split": ({}, "docs/general.md", {"general-query-split"}),
}
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"<!-- ([\w-]+):start -->")


def _script(name: str, monkeypatch):
    return load_benchmark(name, monkeypatch)


@pytest.mark.parametrize("script", sorted(GENERATED))
def test_generated_blocks_equal_what_their_render_step_writes(script, monkeypatch):
    """Each render step, run with the page writer replaced, writes exactly its blocks, to the page
    where they live, and each block there already holds that text: page and results file agree."""
    module = _script(script, monkeypatch)
    from results_io import page_path, read_block

    kwargs, page, markers = GENERATED[script]
    written = {}
    monkeypatch.setattr(module, "write_block", lambda p, marker, text: written.__setitem__(marker, (p, text)))
    module.render(**kwargs)
    assert set(written) == markers
    for marker, (p, text) in written.items():
        assert page_path(p).resolve() == (ROOT / page).resolve(), f"{script}.render writes {marker} to {p}, not {page}"
        assert read_block(ROOT / page, marker).strip() == text.strip(), f"{page}: block {marker} is stale; run {script}"


def test_every_marker_block_has_a_render_step_and_lives_on_one_page():
    owner = {m: page for _, page, markers in GENERATED.values() for m in markers}
    seen: dict[str, list[str]] = {}
    for path in PAGES:
        text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)  # examples in code fences
        rel = path.relative_to(ROOT).as_posix()
        for marker in MARKER.findall(text):
            assert text.count(f"<!-- {marker}:end -->") == 1, f"{rel}: {marker} has no single end marker"
            seen.setdefault(marker, []).append(rel)
    assert {m: pages for m, pages in seen.items() if len(pages) > 1} == {}
    assert {m: pages[0] for m, pages in seen.items()} == owner


def test_write_block_rewrites_only_its_block(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from results_io import read_block, write_block

    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- a:start -->\nold a\n<!-- a:end -->\nmiddle\n<!-- b:start -->\nold b\n<!-- b:end -->\n")
    write_block(page, "a", "new a\n| x |")
    assert page.read_text() == ("intro\n<!-- a:start -->\nnew a\n| x |\n<!-- a:end -->\nmiddle\n"
                                "<!-- b:start -->\nold b\n<!-- b:end -->\n")
    assert read_block(page, "b") == "old b\n"
    with pytest.raises(SystemExit, match="c:start"):
        write_block(page, "c", "text")


def test_serving_rows_have_no_errors_and_sync_encodes_only_the_changed_tools():
    rows = json.loads((ROOT / "benchmarks/results/agents.json").read_text())["rows"]
    serve = [r for r in rows if r["method"] == "serve/search_tools"]
    assert serve and all(r["metrics"]["errors"] == 0 for r in serve)
    sync = next(r for r in rows if r["method"] == "serve/sync")["metrics"]
    assert sync["encoded"] == sync["changed_tools"] == 1000


def test_soak_row_served_for_ten_minutes_with_no_errors_and_flat_resources():
    """Issue 20's soak goal: 20 clients, 10 minutes, swaps every 30 s, a 5 MB query a minute; no error
    apart from the refused oversize ones, memory and open files flat."""
    rows = [r for r in json.loads((ROOT / "benchmarks/results/serve.json").read_text())["rows"]
            if r["method"] == "serve/soak"]
    assert rows
    for r in rows:
        m = r["metrics"]
        assert m["clients"] >= 20 and m["seconds"] >= 600 and m["swaps"] >= 19
        assert m["errors"] == 0 and m["oversized_refused_413"] == m["oversized_sent"] >= 10
        assert m["fds_end"] <= m["fds_start"] + 5 and m["files_written_by_server"] == 0
        assert m["rss_mb_max"] <= 1.25 * m["rss_mb_start"] and m["server_alive"]
