"""The Python snippets a newcomer copies first run as written: the README's train -> load -> retrieve (on
the tiny model, into the run folder the README's command names: file names are found, never hard-coded)
and getting-started's Retriever walk-through (MiniLM over ToolLens, adding a tool it then finds)."""

import re
import shlex
from pathlib import Path

import pytest
from conftest import tiny_train_overrides

ROOT = Path(__file__).resolve().parents[1]


def python_block(page: str, marker: str) -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / page).read_text(encoding="utf-8"), re.S | re.M)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"{page}: {len(found)} python blocks hold {marker!r}"
    return found[0]


def readme_train_out_dir() -> str:
    """``out_dir`` of the README's CPU-sized training command, the folder its snippet loads."""
    lines = [ln for ln in (ROOT / "README.md").read_text().splitlines()
             if ln.startswith("python train.py --config configs/bi_encoder_toollens_fast_quick.yaml")]
    assert lines, "README.md shows no CPU-sized training command"
    args = shlex.split(lines[0].split("#")[0])
    return next(a.partition("=")[2] for a in args if a.startswith("out_dir="))


def test_the_readme_train_load_retrieve_snippet_runs_as_written(synthetic_dataset_dir, tiny_bert_dir, tmp_path,
                                                                  monkeypatch, capsys):
    from toolgraph.cli import main

    out_dir = readme_train_out_dir()
    snippet = python_block("README.md", "toolgraph.load(run)")
    assert f'Path("{out_dir}")' in snippet, "the snippet loads another folder than the README trains into"
    monkeypatch.chdir(tmp_path)
    assert main(["train", *tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, Path(out_dir), steps=4)]) == 0
    capsys.readouterr()
    scope: dict = {}
    exec(compile(snippet, "README.md snippet", "exec"), scope)  # noqa: S102 - the docs' own code
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 5, printed
    for rank, line in enumerate(printed, 1):
        n, score, tool_id, *name = line.split()
        assert int(n) == rank and float(score) == round(float(score), 3) and tool_id and name
    ids, scores = scope["ranking"].ids[1], scope["ranking"].scores[1].tolist()
    assert len(ids) == 5 and all(isinstance(s, float) for s in scores) and scores == sorted(scores, reverse=True)


@pytest.mark.realdata
def test_the_getting_started_retriever_snippet_runs_as_written(data_root, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TOOLGRAPH_DATA", str(data_root))
    monkeypatch.chdir(tmp_path)
    snippet = python_block("docs/getting-started.md", "new_tools = ")
    scope: dict = {}
    exec(compile(snippet, "getting-started snippet", "exec"), scope)  # noqa: S102 - the docs' own code
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == "search_tofu_recipes", printed  # the added tool is found after the save and load
    assert len(printed) == 6 and [int(line.split()[0]) for line in printed[:5]] == [1, 2, 3, 4, 5]
    assert (tmp_path / "my_retriever" / "retriever.json").is_file()
    assert len(scope["r2"].tools) == len(scope["ds"].tools)  # one added, one removed
