"""toolgraph report --html: one self-contained comparison page, checked in headless Chromium."""

import json
import re

import pytest
from browser import rendered_dom

from toolgraph.cli import main
from toolgraph.errors import DataError
from toolgraph.report import load_run, missed_and_above, render_html, significance

# three queries of a tiny dataset (no data folder: ids stand for texts); gold and each run's ranking
GOLD = {"q1": ["a", "b"], "q2": ["c"], "q3": ["d"]}
RANKS = {"A": {"q1": ["a", "x", "y", "z", "w", "b"], "q2": ["c", "x"], "q3": ["x", "y", "d"]},
         "B": {"q1": ["a", "b", "x"], "q2": ["x", "y", "z", "w", "v", "c"], "q3": ["d", "x"]}}


def make_run(folder, name, metrics, curve=None):
    folder.mkdir(parents=True)
    results = {"metrics": metrics, "config": {"data": {"name": "no-such-dataset"}}}
    (folder / "results.json").write_text(json.dumps(results))
    with (folder / "rankings.jsonl").open("w") as f:
        for q, gold in GOLD.items():
            top = [{"id": t, "score": -i} for i, t in enumerate(RANKS[name][q])]
            f.write(json.dumps({"query": q, "gold": gold, "top": top}) + "\n")
    if curve:
        (folder / "logs").mkdir()
        lines = ["epoch,step,train/loss,val/recall@5"] + [f"0,{s},{v},{'' if s % 2 else v / 10}" for s, v in curve]
        (folder / "logs" / "metrics.csv").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture
def two_runs(tmp_path):
    a = make_run(tmp_path / "A", "A", {"recall@5": 0.5, "ndcg@5": 0.4, "mrr": 0.61}, curve=[(1, 2.0), (2, 1.5), (4, 1.0)])
    b = make_run(tmp_path / "B", "B", {"recall@5": 0.6667, "ndcg@5": 0.7, "mrr": 0.72})
    return a, b


def test_wins_losses_and_misses_are_counted_per_query(two_runs):
    a, b = (load_run(f) for f in two_runs)
    page = render_html([a, b])
    # R@5 per query: A q1 .5 q2 1 q3 1; B q1 1 q2 0 q3 1 -> B wins q1, loses q2
    assert 'data-wins="1" data-losses="1" data-common="3"' in page
    assert re.search(r"Mean difference <b>-0\.1667</b> \(95 % interval \[-\d\.\d{4}, \+\d\.\d{4}\], paired "
                     r"bootstrap p = \d\.\d{3}\)", page)
    assert re.search(r'<table class="queries wins">.*data-query="q1"', page)
    assert re.search(r'<table class="queries losses">.*data-query="q2"', page)
    missed, above = missed_and_above(a, k=5)
    assert missed == {"b": 1}  # A ranks b sixth
    assert above == {"x": 2, "y": 2, "z": 1, "w": 1}  # above A's last gold hit: q1 x y z w, q3 x y
    assert '<td data-run="B" data-metric="recall@5" class="best">0.6667</td>' in page
    assert '<td data-run="A" data-metric="mrr">0.6100</td>' in page
    results = json.loads((a.folder / "results.json").read_text())
    a.results = {**results, "intervals": {"mrr": [0.5, 0.7]}}  # written by evaluations: shown on hover
    assert 'data-metric="mrr" title="95 % interval [0.5000, 0.7000]">0.6100</td>' in render_html([a, b])
    assert page.count("<svg") == 4  # Recall@K, NDCG@K, and A's train/loss and val/recall@5
    assert "query texts and tool names not shown" in page  # no such dataset: ids instead, said so


def test_a_folder_without_rankings_is_named(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.json").write_text('{"metrics": {}}')
    with pytest.raises(DataError, match="rankings.jsonl"):
        load_run(tmp_path / "r")
    make_run(tmp_path / "bad", "A", {})
    with (tmp_path / "bad" / "rankings.jsonl").open("a") as f:
        f.write('{"query": "q9"}\n')
    with pytest.raises(DataError, match="line 4"):
        load_run(tmp_path / "bad")
    make_run(tmp_path / "badlog", "A", {}, curve=[(1, 2.0), (2, 1.5)])
    with (tmp_path / "badlog" / "logs" / "metrics.csv").open("a") as f:
        f.write("0,3,nan?,\n")
    with pytest.raises(DataError, match=r"line 4: train/loss or step is not a number"):
        load_run(tmp_path / "badlog")


def test_ci_gives_intervals_and_the_paired_difference(two_runs, tmp_path, capsys):
    assert main(["report", *map(str, two_runs), "--ci", "--samples", "500"]) == 0
    out = capsys.readouterr().out
    assert "recall@5 with 95 % bootstrap intervals over queries (500 resamples); paired difference from A" in out
    # R@5 per query: A .5 1 1 (0.8333), B 1 0 1 (0.6667): B - A = -0.1667 over the 3 common queries
    assert re.search(r"\nA +0\.8333  \[0\.\d{4}, 1\.0000\] +3\n", out), out
    assert re.search(r"\nB +0\.6667  \[0\.\d{4}, 1\.0000\] +-0\.1667  \[-\d\.\d{4}, \+\d\.\d{4}\] +\d\.\d{3}  3\n", out), out
    rows = significance([load_run(f) for f in two_runs], "mrr", samples=200)
    assert rows[0]["mrr"] == pytest.approx((1 + 1 + 1 / 3) / 3) and "paired" in rows[1]
    with pytest.raises(SystemExit):
        main(["report", *map(str, two_runs), "--ci", "--samples", "0"])
    assert "--samples: expected a whole number >= 1, got '0'" in capsys.readouterr().err
    with pytest.raises(DataError, match=r"--metric 'recall': expected one of .* with @K"):
        significance([load_run(two_runs[0])], "recall")
    other = make_run(tmp_path / "C", "A", {})
    rows = re.sub(r'"query": "q', '"query": "other-q', (other / "rankings.jsonl").read_text())
    (other / "rankings.jsonl").write_text(rows)
    with pytest.raises(DataError, match=r"C/rankings.jsonl.*no query in common with .*A/rankings.jsonl"):
        significance([load_run(two_runs[0]), load_run(other)])


def test_the_page_loads_in_headless_chromium_without_errors(two_runs, tmp_path, capsys):
    page = tmp_path / "report.html"
    assert main(["report", *map(str, two_runs), "--html", str(page)]) == 0
    assert f"wrote {page}" in capsys.readouterr().out
    dom = rendered_dom(page, tmp_path)
    assert '<td data-run="B" data-metric="recall@5" class="best">0.6667</td>' in dom
