"""Loading a file never runs code, never reads a model from outside it, never allocates what its
weights do not hold; configs keep literals and bound YAML aliases (issue 41, finding 1 and the
loading items of finding 9).

Hostile checkpoints are built from the legacy fixture, so everything but the edit is valid. Where a
finding is about what happens when a user answers transformers' "run the custom code? [y/N]"
prompt, the load runs in a child process whose stdin says "y" (the ``echo y |`` of the finding)."""

import ast
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import toolgraph
from toolgraph.config import TrainConfig, config_from_dict, load_config, to_saved, to_yaml
from toolgraph.errors import ConfigError, DataError

ROOT = Path(__file__).resolve().parents[1]
LEGACY = ROOT / "tests" / "fixtures" / "legacy"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}


def _hostile(tmp_path: Path, edit) -> Path:
    ckpt = torch.load(LEGACY / "bi_encoder.ckpt", map_location="cpu", weights_only=True)
    edit(ckpt["toolgraph"]["artifacts"]["query"])
    out = tmp_path / "hostile.ckpt"
    torch.save(ckpt, out)
    return out


def _load_answering_yes(path: Path, *, limit_memory: int | None = None) -> subprocess.CompletedProcess:
    """``toolgraph.load(path)`` in a child whose stdin answers "y" to any prompt."""
    code = ("import resource, sys\n"
            f"if {limit_memory!r}: resource.setrlimit(resource.RLIMIT_AS, ({limit_memory!r}, {limit_memory!r}))\n"
            "import toolgraph\n"
            "try:\n"
            f"    toolgraph.load({str(path)!r})\n"
            "except Exception as e:\n"
            "    print(f'{type(e).__name__}: {e}'); sys.exit(3)\n"
            "print('LOADED')\n")
    return subprocess.run([sys.executable, "-c", code], input="y\ny\n", capture_output=True, text=True,
                          env=ENV, cwd=path.parent, timeout=300)


def _code_that_leaves_a_mark(mark: Path) -> str:
    return (f"open({str(mark)!r}, 'w').write('ran')\n"
            "from transformers import BertTokenizerFast\n"
            "class Evil(BertTokenizerFast):\n    pass\n")


def test_a_checkpoints_tokenizer_code_never_runs(tmp_path):
    mark = tmp_path / "PWNED"

    def edit(art):
        files = art["tokenizer_files"]
        config = json.loads(files["tokenizer_config.json"])
        config.pop("tokenizer_class", None)  # so transformers has no class of its own and asks to run the file
        config["auto_map"] = {"AutoTokenizer": ["evil.Evil", None]}
        files["tokenizer_config.json"] = json.dumps(config)
        files["evil.py"] = _code_that_leaves_a_mark(mark)

    done = _load_answering_yes(_hostile(tmp_path, edit))
    assert not mark.exists(), "the checkpoint's Python file ran"
    assert done.returncode == 3 and "DataError" in done.stdout and "evil.py" in done.stdout, done.stdout + done.stderr
    assert "hostile.ckpt" in done.stdout  # names the file


def test_a_checkpoint_asking_for_custom_tokenizer_code_is_refused(tmp_path):
    def edit(art):  # no file: transformers would look for the module beside it or on the Hub
        config = json.loads(art["tokenizer_files"]["tokenizer_config.json"])
        config.pop("tokenizer_class", None)
        config["auto_map"] = {"AutoTokenizer": ["someone/repo--tok.Evil", None]}
        art["tokenizer_files"]["tokenizer_config.json"] = json.dumps(config)

    with pytest.raises(DataError, match="custom model code") as e:
        toolgraph.load(_hostile(tmp_path, edit))
    assert "tokenizer_config.json" in str(e.value) and "hostile.ckpt" in str(e.value)


def test_a_checkpoint_whose_model_config_asks_for_custom_code_is_refused(tmp_path):
    def edit(art):
        art["hf_config"]["auto_map"] = {"AutoModel": "someone/repo--modeling.Evil"}

    with pytest.raises(DataError, match="custom model code") as e:
        toolgraph.load(_hostile(tmp_path, edit))
    assert "hf_config" in str(e.value)


def test_a_saved_folder_asking_for_custom_code_never_runs_it(tmp_path):
    folder = tmp_path / "export"
    shutil.copytree(LEGACY / "bi_encoder_export", folder)
    mark = tmp_path / "PWNED"
    enc = next(p.parent for p in folder.rglob("config.json") if (p.parent / "tokenizer_config.json").is_file())
    config = json.loads((enc / "tokenizer_config.json").read_text())
    config.pop("tokenizer_class", None)
    config["auto_map"] = {"AutoTokenizer": ["evil.Evil", None]}
    (enc / "tokenizer_config.json").write_text(json.dumps(config))
    (enc / "evil.py").write_text(_code_that_leaves_a_mark(mark))
    (folder / "manifest.json").unlink(missing_ok=True)  # a folder without a manifest: the code check still holds

    done = _load_answering_yes(folder)
    if done.returncode == 0:  # the encoder loads when the retriever first encodes: ask for a ranking
        code = f"import toolgraph; toolgraph.load({str(folder)!r}).retrieve(['weather'], 1)"
        done = subprocess.run([sys.executable, "-c", code], input="y\n", capture_output=True, text=True, env=ENV,
                              timeout=300)
    assert not mark.exists(), "the saved folder's Python file ran"
    assert done.returncode != 0 and "custom model code" in done.stdout + done.stderr


def test_every_transformers_load_in_the_package_refuses_remote_code():
    """Every ``from_pretrained`` / ``from_config`` call says ``trust_remote_code=False``: None lets
    transformers ask on stdin, which a pipe can answer."""
    missing = []
    for path in sorted((ROOT / "toolgraph").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("from_pretrained", "from_config"):
                ok = any(k.arg == "trust_remote_code" and isinstance(k.value, ast.Constant) and k.value.value is False
                         for k in node.keywords)
                if not ok:
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not missing, f"without trust_remote_code=False: {missing}"


def test_an_oversized_model_config_is_refused_before_anything_is_allocated(tmp_path):
    """4 MB of weights with a config of hidden 65,536 and 48 layers: without the check, building the
    model alone wants >8 GB. The child may use 4 GB of address space in all."""
    def edit(art):
        art["hf_config"].update(hidden_size=65_536, num_hidden_layers=48, intermediate_size=65_536,
                                num_attention_heads=64)

    start = time.monotonic()
    done = _load_answering_yes(_hostile(tmp_path, edit), limit_memory=4 << 30)
    assert done.returncode == 3 and "does not fit its weights" in done.stdout, done.stdout + done.stderr[-2000:]
    assert "65536" in done.stdout and "hostile.ckpt" in done.stdout
    assert time.monotonic() - start < 120


def _export_naming(tmp_path: Path, model: str | None = None) -> Path:
    """The legacy exported folder, as older versions wrote it (no manifest), its model named ``model``."""
    folder = tmp_path / "export"
    shutil.copytree(LEGACY / "bi_encoder_export", folder)
    (folder / "manifest.json").unlink(missing_ok=True)
    if model is not None:
        meta = json.loads((folder / "retriever.json").read_text())
        meta["config"]["model"] = model
        (folder / "retriever.json").write_text(json.dumps(meta))
    return folder


def test_a_saved_folder_never_loads_an_encoder_from_outside_itself(tmp_path, tiny_bert_dir):
    for model in (str(tiny_bert_dir), "../elsewhere/encoder", "~/models/x"):
        shutil.rmtree(tmp_path / "export", ignore_errors=True)
        with pytest.raises(DataError, match="outside the saved retriever") as e:
            toolgraph.load(_export_naming(tmp_path, model))
        assert "retriever.json" in str(e.value)


def test_a_saved_folder_never_downloads_its_encoder(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # even where the hub could be reached
    with pytest.raises(DataError, match="never downloads"):
        toolgraph.load(_export_naming(tmp_path, "someone-unknown/encoder-not-cached"))


def test_a_saved_folder_may_still_name_the_packaged_minilm(tmp_path):
    assert toolgraph.load(_export_naming(tmp_path, "all-MiniLM-L6-v2")).config.model == "all-MiniLM-L6-v2"


# ---- configs: literals survive, aliases are bounded ------------------------------------------------
def test_a_literal_dollar_brace_in_an_override_round_trips():
    cfg = load_config(TrainConfig, [], [r"logger.run_name=cost \${usd}", "model.name=bi_encoder"])
    assert cfg.logger.run_name == "cost ${usd}"
    assert config_from_dict(to_saved(cfg)).logger.run_name == "cost ${usd}"  # a checkpoint's copy loads
    assert load_config(TrainConfig, [_written(to_yaml(cfg))]).logger.run_name == "cost ${usd}"  # config.yaml too


def _written(text: str) -> Path:
    import tempfile

    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    f.write(text)
    f.close()
    return Path(f.name)


def test_a_saved_retriever_keeps_a_literal_dollar_brace(tmp_path, tiny_dataset_dir, tiny_bert_dir):
    from toolgraph.data import load_dataset
    from toolgraph.retrieval.dense import DenseConfig, DenseRetriever

    r = DenseRetriever(DenseConfig(model=str(tiny_bert_dir), query_prefix="${not resolved} ", cache_dir=None,
                                   progress=False))
    r.index(load_dataset(str(tiny_dataset_dir)).tools)
    r.save(tmp_path / "dense")
    back = toolgraph.load(tmp_path / "dense")
    assert back.config.query_prefix == "${not resolved} "
    assert back.retrieve(["weather in paris"], 2).ids[0] == r.retrieve(["weather in paris"], 2).ids[0]


def _laughs(levels: int = 7) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_a_few_hundred_bytes_of_nested_yaml_aliases_are_refused_at_once(tmp_path):
    path = tmp_path / "laughs.yaml"
    path.write_text(_laughs())
    assert path.stat().st_size < 500
    code = ("from toolgraph.config import EvaluateConfig, load_config\n"
            f"load_config(EvaluateConfig, [{str(path)!r}])\n")
    try:  # in a child, so that the unbounded version fails the test instead of hanging it
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("loading 400 bytes of YAML ran for over a minute")
    assert "ConfigError" in done.stderr and "aliases" in done.stderr and "laughs.yaml" in done.stderr


def test_nested_aliases_in_an_override_are_refused():
    """OmegaConf (2.4) bounds the aliases of an override's value itself; this keeps it so."""
    value = "[&a [1,1,1,1,1,1,1,1,1,1], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], " \
            "&d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d], [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]]"
    with pytest.raises(ConfigError, match="expan") as e:
        load_config(TrainConfig, [], [f"eval.ks={value}"])
    assert "override" in str(e.value)


def test_ordinary_aliases_still_load(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("eval: {ks: &k [1, 5]}\nretriever: {name: bm25}\n")
    from toolgraph.config import EvaluateConfig

    assert load_config(EvaluateConfig, [path]).eval.ks == [1, 5]


def test_a_run_with_a_literal_dollar_brace_trains_and_its_checkpoint_loads(synthetic_dataset_dir, tiny_bert_dir,
                                                                          tmp_path):
    """Before: the task re-read the run's config as a "checkpoint config" and refused the literal."""
    from conftest import tiny_train_overrides

    from toolgraph.training import train

    out = tmp_path / "run"
    over = [*tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, out, steps=8), r"logger.run_name=cost \${usd}"]
    summary = train(load_config(TrainConfig, [], over))
    ckpt = torch.load(summary["best_checkpoint"], map_location="cpu", weights_only=True)
    assert config_from_dict(ckpt["hyper_parameters"]["config"]).logger.run_name == "cost ${usd}"
    assert load_config(TrainConfig, [out / "config.yaml"]).logger.run_name == "cost ${usd}"
    assert len(toolgraph.load(summary["best_checkpoint"]).retrieve(["weather"], 2).ids[0]) == 2
