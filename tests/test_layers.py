"""The package reads from the bottom up: every module imports alone (no hidden reliance on an
import order), and the low layers stay light (loading a config pulls in neither Lightning nor PyG).
The import order itself is checked by import-linter (pyproject.toml contracts, `make lint`)."""

import json
import os
import subprocess
import sys
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


# one interpreter imports the heavy third-party packages once, then forks a child per toolgraph module:
# each child starts with no toolgraph module loaded and imports only its own (what this test checks:
# no reliance on an import order among toolgraph's modules), in a fraction of a second instead of the
# ~3 s a fresh interpreter needs to import torch and Lightning again
PRELOAD = "import lightning, numpy, omegaconf, torch, torch_geometric, torchmetrics, transformers  # noqa: F401\n"
FORK_EACH = """
import json, os, sys, traceback
""" + PRELOAD + """assert not any(m == "toolgraph" or m.startswith("toolgraph.") for m in sys.modules)
failed = {}
for name in json.loads(sys.argv[1]):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            __import__(name)
            msg = b""
        except BaseException:
            msg = traceback.format_exc().strip().splitlines()[-1].encode()
        os.write(w, msg)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    if out or status:
        failed[name] = out.decode() or f"exit status {status}"
print(json.dumps(failed))
"""


def test_every_module_imports_alone_in_a_fresh_interpreter():
    assert len(MODULES) > 40 and "toolgraph.retrieval.loading" in MODULES
    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    run = subprocess.run([sys.executable, "-c", FORK_EACH, json.dumps(MODULES)], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    failed = json.loads(run.stdout.strip().splitlines()[-1])
    assert not failed, failed


def test_a_module_that_relies_on_an_import_order_is_caught(tmp_path):
    """The check above fails for a module that only works when another was imported first."""
    pkg = tmp_path / "orderpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import orderpkg\norderpkg.shared = 1\n")
    (pkg / "b.py").write_text("import orderpkg\nvalue = orderpkg.shared\n")  # needs a first
    check = FORK_EACH.replace("toolgraph", "orderpkg").replace(PRELOAD, "")  # nothing heavy to preload here
    run = subprocess.run([sys.executable, "-c", check,
                          json.dumps(["orderpkg.a", "orderpkg.b"])], cwd=tmp_path, env=ENV, capture_output=True,
                         text=True, timeout=600)
    failed = json.loads(run.stdout.strip().splitlines()[-1])
    assert list(failed) == ["orderpkg.b"] and "AttributeError" in failed["orderpkg.b"]


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
from toolgraph.retrieval import RETRIEVERS, Ranking, Retriever, RetrieverConfig, build_retriever, resolve_retriever
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
    # 18: retrieval.progress (bars) and data.request_pieces (the request split rules, read by retrieval.steps)
    assert "toolgraph.retrieval.bm25" in loaded and len(loaded) <= 18, loaded
    assert not [m for m in loaded if m.startswith(("toolgraph.tasks", "toolgraph.training", "toolgraph.retrieval.dense",
                                                   "toolgraph.data.graph", "toolgraph.nn"))], loaded
