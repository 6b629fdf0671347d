"""The package reads from the bottom up: every module imports alone (no hidden reliance on an
import order), and the low layers stay light (loading a config pulls in neither Lightning nor PyG).
The import order itself is checked by import-linter (pyproject.toml contracts, `make lint`)."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "toolgraph"
MODULES = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts[:-1] if p.name == "__init__.py"
             else p.relative_to(ROOT).with_suffix("").parts)
    for p in PACKAGE.rglob("*.py"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled"}


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=300)


def test_every_module_imports_alone_in_a_fresh_interpreter():
    assert len(MODULES) > 40 and "toolgraph.retrieval.loading" in MODULES
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = dict(zip(MODULES, pool.map(lambda m: _python(f"import {m}"), MODULES), strict=True))
    failed = {m: r.stderr.strip().splitlines()[-1] for m, r in runs.items() if r.returncode != 0}
    assert not failed, failed


HEAVY = ("lightning", "pytorch_lightning", "torch_geometric")


@pytest.mark.parametrize("schema,folder", [("EvaluateConfig", "configs/eval"), ("EvaluateConfig", "configs/retriever")])
def test_loading_an_evaluation_config_imports_neither_lightning_nor_pyg(schema, folder):
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / folder).glob("*.yaml"))
    assert files
    code = f"""
import json, sys
from toolgraph.config import {schema}, load_config
for f in {files!r}:
    load_config({schema}, [f])
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r}))))
"""
    run = _python(code)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []


def test_the_public_api_is_where_it_was():
    code = """
import toolgraph
from toolgraph.retrieval import RETRIEVERS, Ranking, Retriever, RetrieverConfig, build_retriever
from toolgraph.training import TrainConfig, train
from toolgraph.data import load_dataset, prepare_dataset
from toolgraph.cli import main
assert callable(toolgraph.load) and "bm25" in RETRIEVERS
print("ok")
"""
    run = _python(code)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


def test_a_bm25_config_loads_bm25_and_the_layers_below_only():
    """The registry imports the module named like the retriever first, so a BM25 config does not
    drag in every retriever (the issue measured 28 modules and PyG before the layering)."""
    code = """
import json, sys
from toolgraph.config import EvaluateConfig, load_config
load_config(EvaluateConfig, ["configs/eval/bm25_toollens.yaml"])
print(json.dumps(sorted(m for m in sys.modules if m.startswith("toolgraph"))))
"""
    run = _python(code)
    assert run.returncode == 0, run.stderr[-2000:]
    loaded = json.loads(run.stdout.strip().splitlines()[-1])
    assert "toolgraph.retrieval.bm25" in loaded and len(loaded) <= 16, loaded
    assert not [m for m in loaded if m.startswith(("toolgraph.tasks", "toolgraph.training", "toolgraph.retrieval.dense",
                                                   "toolgraph.data.graph", "toolgraph.nn"))], loaded
