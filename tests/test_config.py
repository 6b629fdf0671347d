"""Strict config merging: unknown keys and wrong types fail naming the key and the file."""

import re
import time
from pathlib import Path

import pytest

from toolgraph.config import EvaluateConfig, load_config, parse_overrides, to_yaml
from toolgraph.errors import ConfigError
from toolgraph.retrieval.bm25 import BM25Config
from toolgraph.retrieval.dense import DenseConfig

ROOT = Path(__file__).resolve().parents[1]
EVAL_CONFIGS = sorted(ROOT.glob("configs/eval/*.yaml"))
TRAIN_CONFIGS = sorted(ROOT.glob("configs/*.yaml"))
CLUSTER_CONFIGS = sorted(ROOT.glob("configs/cluster/*.yaml"))
SWEEPS = sorted(ROOT.glob("configs/sweeps/*.yaml"))
RETRIEVER_PRESETS = sorted(ROOT.glob("configs/retriever/*.yaml"))
METHOD_PRESETS = sorted(ROOT.glob("configs/methods/*.yaml"))


def _write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_defaults_and_polymorphic_section():
    cfg = load_config(EvaluateConfig)
    assert isinstance(cfg.retriever, BM25Config) and cfg.data.name == "toollens"
    cfg = load_config(EvaluateConfig, overrides=["retriever.name=dense", "--retriever.pooling=cls"])
    assert isinstance(cfg.retriever, DenseConfig) and cfg.retriever.pooling == "cls"


def test_files_merge_in_order_and_overrides_win(tmp_path):
    a = _write(tmp_path, "retriever: {name: dense, max_length: 64}\neval: {ks: [1, 2]}\n", "a.yaml")
    b = _write(tmp_path, "retriever: {max_length: 128}\n", "b.yaml")
    cfg = load_config(EvaluateConfig, [a, b], ["eval.depth=7"])
    assert cfg.retriever.max_length == 128 and cfg.eval.ks == [1, 2] and cfg.eval.depth == 7
    assert "max_length: 128" in to_yaml(cfg)


def test_unknown_key_names_key_and_file(tmp_path):
    p = _write(tmp_path, "eval:\n  kss: [1]\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: key 'eval\.kss'"):
        load_config(EvaluateConfig, [p])


def test_key_of_another_retriever_is_unknown(tmp_path):
    p = _write(tmp_path, "retriever: {name: bm25, pooling: mean}\n")
    with pytest.raises(ConfigError, match="retriever.pooling"):
        load_config(EvaluateConfig, [p])


def test_wrong_type_names_key_and_source(tmp_path):
    p = _write(tmp_path, "eval: {depth: many}\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: key 'eval\.depth'"):
        load_config(EvaluateConfig, [p])
    with pytest.raises(ConfigError, match=r"override 'eval.depth=lots': key 'eval\.depth'"):
        load_config(EvaluateConfig, overrides=["eval.depth=lots"])


def test_unknown_retriever_name_lists_known():
    with pytest.raises(ConfigError, match=r"retriever.name: unknown retriever 'nope'; known: .*bm25"):
        load_config(EvaluateConfig, overrides=["retriever.name=nope"])


def test_bad_yaml_and_bad_override(tmp_path):
    p = _write(tmp_path, "eval: [1,\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:\d+: invalid YAML"):
        load_config(EvaluateConfig, [p])
    with pytest.raises(ConfigError, match="not found"):
        load_config(EvaluateConfig, [tmp_path / "missing.yaml"])
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["eval.depth"])
    top = _write(tmp_path, "- a\n- b\n", "list.yaml")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(EvaluateConfig, [top])


def test_errors_are_fast(tmp_path):
    p = _write(tmp_path, "eval: {nope: 1}\n")
    t0 = time.perf_counter()
    with pytest.raises(ConfigError):
        load_config(EvaluateConfig, [p])
    assert time.perf_counter() - t0 < 2.0


def _ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def test_every_yaml_is_covered():
    assert set(ROOT.glob("configs/**/*.yaml")) == set(EVAL_CONFIGS + TRAIN_CONFIGS + CLUSTER_CONFIGS + SWEEPS
                                                      + RETRIEVER_PRESETS + METHOD_PRESETS)


@pytest.mark.parametrize("path", EVAL_CONFIGS + RETRIEVER_PRESETS, ids=_ids(EVAL_CONFIGS + RETRIEVER_PRESETS))
def test_every_eval_yaml_is_valid(path):
    """Every YAML we ship is a test case (litgpt's config-hub test)."""
    cfg = load_config(EvaluateConfig, [path])
    assert cfg.data.name and cfg.retriever.name


def _leaves(node, prefix=""):
    """``key.path=value`` (value as JSON, which the override parser reads back) for each leaf."""
    import json

    for key, value in node.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}={json.dumps(value)}"


def _preset_of(path):
    import yaml

    spec = yaml.safe_load(path.read_text())
    presets = spec.pop("defaults", [])
    return [(path.parent / p).resolve() for p in presets], spec


THIN = [p for p in EVAL_CONFIGS if _preset_of(p)[0]]


def test_retriever_presets_are_full_test_split_configs_and_the_eval_files_use_them():
    import yaml

    assert {p.stem for p in RETRIEVER_PRESETS} >= {"bm25", "minilm", "tgr", "t2a"}
    for preset in RETRIEVER_PRESETS:
        spec = yaml.safe_load(preset.read_text())
        assert "defaults" not in spec and "name" not in spec["data"], preset  # the dataset is the caller's
        assert spec["data"]["split"] == "test" and spec["retriever"]["name"] and spec["eval"]["ks"], preset
    # every bm25_<dataset> / minilm_<dataset> eval file is a thin file over its preset
    for path in EVAL_CONFIGS:
        family = path.stem.split("_")[0]
        if family in ("bm25", "minilm"):
            assert _preset_of(path)[0] == [ROOT / "configs/retriever" / f"{family}.yaml"], path
    assert {p for path in THIN for p in _preset_of(path)[0]} == set(RETRIEVER_PRESETS)


@pytest.mark.parametrize("path", THIN, ids=_ids(THIN))
def test_preset_with_a_dataset_gives_the_thin_eval_file(path):
    """``--config configs/retriever/<preset>.yaml data.name=X [what the file sets]`` is the thin file, and
    the thin file sets only what differs from its preset."""
    from omegaconf import OmegaConf

    (preset,), own = _preset_of(path)
    assert "name" in own["data"]
    assert load_config(EvaluateConfig, [preset], list(_leaves(own))) == load_config(EvaluateConfig, [path])
    base = OmegaConf.create(_preset_of(preset)[1])
    for item in _leaves(own):
        key = item.split("=", 1)[0]
        assert OmegaConf.select(base, key, default=None) != OmegaConf.select(OmegaConf.from_dotlist([item]), key), item


@pytest.mark.parametrize("preset", ["bm25", "minilm"])
def test_a_preset_with_data_name_matches_the_dataset_file(preset):
    cfg = load_config(EvaluateConfig, [ROOT / f"configs/retriever/{preset}.yaml"], ["data.name=metatool"])
    assert cfg == load_config(EvaluateConfig, [ROOT / f"configs/eval/{preset}_metatool.yaml"])


@pytest.mark.parametrize("path", TRAIN_CONFIGS + METHOD_PRESETS, ids=_ids(TRAIN_CONFIGS + METHOD_PRESETS))
def test_every_train_yaml_is_valid(path):
    from toolgraph.training import TrainConfig

    cfg = load_config(TrainConfig, [path])
    assert cfg.model.name and cfg.out_dir


# ---- training recipes: a method preset (configs/methods/) plus the recipe's delta ------------------
# top-level files that are not a preset plus a delta, and why
NOT_THIN = {"adapt_catalog.yaml": "an adaptation, not a recipe for a dataset: the catalog and the encoder it starts "
                                  "from are set per run (benchmarks/general.py lodo --adapt)",
            "general.yaml": "benchmarks/general.py keys its leave-one-dataset-out runs by this file's text "
                            "(model_key): a preset edit would change the recipe but not the key",
            "general_top2.yaml": "an overlay on general.yaml, not a recipe",
            "index_train.yaml": "toolgraph index train's recipe: its dataset is the index's own log, written and "
                                "named (data.name) by the command"}
RECIPES = [p for p in TRAIN_CONFIGS if p.name not in NOT_THIN]
MAX_DELTA = 10  # settings a recipe may set over its preset (data.options counts as one)


def _merged(path):
    """The raw YAML ``path`` resolves to with its ``defaults:`` chain (no schema defaults), as a dict."""
    from omegaconf import OmegaConf

    from toolgraph.config import yaml_sources

    return OmegaConf.to_container(OmegaConf.merge(*(node for _, node in yaml_sources(path))))


def _settings(node, prefix=""):
    """``key.path`` -> value of each setting a YAML mapping holds; an adapter's ``options`` is one setting."""
    out = {}
    for key, value in node.items():
        if isinstance(value, dict) and value and key != "options":
            out.update(_settings(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def test_recipes_not_written_as_a_preset_plus_a_delta_are_named():
    assert set(NOT_THIN) <= {p.name for p in TRAIN_CONFIGS}
    assert METHOD_PRESETS and len(RECIPES) >= 20


@pytest.mark.parametrize("path", RECIPES, ids=_ids(RECIPES))
def test_a_training_recipe_is_its_method_preset_plus_a_short_delta(path):
    """Each recipe names one preset of configs/methods/ and sets only its dataset, out_dir and what differs
    from the preset (at most MAX_DELTA settings, none repeating the preset), so a shared setting lives in
    one place and a per-dataset copy cannot drift from it unseen; the recipe is the preset plus its
    settings as overrides (``train.py --config configs/methods/<m>.yaml data.name=... ...``)."""
    import json

    from toolgraph.training import TrainConfig

    (preset,), own = _preset_of(path)
    assert preset.parent == ROOT / "configs" / "methods" and preset.is_file(), f"{path.name}: defaults: {preset}"
    delta = _settings(own)
    assert "data.name" in delta and "out_dir" in delta, f"{path.name} must name its dataset and out_dir"
    assert len(delta) <= MAX_DELTA, f"{path.name} sets {len(delta)} settings over {preset.name}: {sorted(delta)}"
    inherited = _settings(_merged(preset))
    repeats = [k for k, v in delta.items() if k in inherited and inherited[k] == v]
    assert not repeats, f"{path.name} repeats {preset.name}: {repeats}"
    cfg = load_config(TrainConfig, [path])
    overrides = [f"{k}={json.dumps(v)}" for k, v in delta.items()]
    assert load_config(TrainConfig, [preset], overrides) == cfg
    assert cfg.model.name == load_config(TrainConfig, [preset]).model.name  # a recipe never switches method


def test_method_presets_leave_dataset_and_out_dir_to_the_recipe_and_each_is_used():
    """A preset holds a method's shared settings: never a dataset or a run folder (a preset edit must not
    point recipes at another dataset or at one folder); its defaults: stay inside configs/methods/."""
    for preset in METHOD_PRESETS:
        parents, _ = _preset_of(preset)
        assert all(p.parent == ROOT / "configs" / "methods" for p in parents), preset.name
        merged = _merged(preset)
        assert "out_dir" not in merged and "name" not in merged.get("data", {}), preset.name
        assert merged["model"]["name"], preset.name
    used = {p for path in RECIPES for p in _preset_of(path)[0]} | {p for m in METHOD_PRESETS for p in _preset_of(m)[0]}
    assert used == set(METHOD_PRESETS), sorted(p.name for p in set(METHOD_PRESETS) - used)


# What each recipe resolves to (its defaults: chain merged, schema defaults aside), pinned: a preset edit
# changes every recipe that names it, and this lists them, so a change meant for one dataset cannot leak
# into another unseen. Changed a recipe on purpose? Paste the new lines the failure prints.
RESOLVED_RECIPES = {
    "adapt_catalog.yaml": "81ca5b9207b1",
    "bi_encoder_metatool_fast.yaml": "0619289b7f51",
    "bi_encoder_toollens.yaml": "243f799d5ebd",
    "bi_encoder_toollens_fast.yaml": "d7ad6f6ec590",
    "bi_encoder_toollens_fast_quick.yaml": "75b9df4da52f",
    "bi_encoder_toollens_quick.yaml": "23ef6cba1f6b",
    "bi_encoder_ultratool_fast.yaml": "eb66d57252d3",
    "cross_encoder_toollens.yaml": "127f9bbf346a",
    "dependency_links.yaml": "ad0dea58a837",
    "discriminator.yaml": "56606c6a6959",
    "discriminator_cross.yaml": "1f3c64d4026d",
    "discriminator_pretrain.yaml": "ed70e1513227",
    "general.yaml": "16dc86a0fb01",
    "general_top2.yaml": "39e5283338ad",
    "graph_toollens.yaml": "f13226899dde",
    "index_train.yaml": "897cf4f76a14",
    "graph_ultratool.yaml": "35db1ef7e38c",
    "mlc_toollens.yaml": "c7500935dcf4",
    "mlc_toollens_fast.yaml": "249eb0b2bc19",
    "mlc_ultratool.yaml": "17bf4826ffab",
    "refiner_toollens.yaml": "d685c587f353",
    "refiner_toollens_crossfit.yaml": "5ce6d332e42a",
    "refiner_toollens_fast.yaml": "78b7d31979b1",
    "refiner_ultratool.yaml": "44618faddaa1",
}


def _digest(path):
    import hashlib
    import json

    return hashlib.sha256(json.dumps(_merged(path), sort_keys=True).encode()).hexdigest()[:12]


def test_what_each_recipe_resolves_to_is_pinned():
    now = {p.name: _digest(p) for p in TRAIN_CONFIGS}
    changed = sorted(k for k in set(now) | set(RESOLVED_RECIPES) if now.get(k) != RESOLVED_RECIPES.get(k))
    assert not changed, "recipes whose resolved settings changed: " + ", ".join(changed) + "\n" + "\n".join(
        f'    "{k}": "{now[k]}",' for k in sorted(now))


@pytest.mark.parametrize("path", CLUSTER_CONFIGS, ids=_ids(CLUSTER_CONFIGS))
def test_every_cluster_overlay_merges_over_a_recipe(path):
    from toolgraph.training import TrainConfig

    cfg = load_config(TrainConfig, [ROOT / "configs/bi_encoder_toollens.yaml", path])
    assert cfg.trainer.devices not in (None, "")


@pytest.mark.parametrize("path", SWEEPS, ids=_ids(SWEEPS))
def test_sweep_parameters_are_config_keys_and_a_sample_builds(path):
    """Every swept key exists with the right type; one sampled override set builds a config,
    passed the way a W&B agent passes ${args_no_hyphens} (key=value) and as --key=value."""
    import random

    import yaml

    from toolgraph.cli import build_parser
    from toolgraph.training import TrainConfig

    spec = yaml.safe_load(path.read_text())
    assert spec["command"][-1] == "${args_no_hyphens}"
    recipe = spec["command"][spec["command"].index("--config") + 1]
    rng = random.Random(0)
    for _ in range(3):
        sample = [f"{k}={rng.choice(v['values'])}" for k, v in spec["parameters"].items()]
        cfg = load_config(TrainConfig, [ROOT / recipe], sample)
        for item in sample:
            key, value = item.split("=", 1)
            section, name = key.split(".")
            assert str(getattr(getattr(cfg, section), name)).lower() == str(yaml.safe_load(value)).lower()
        args, unknown = build_parser().parse_known_args(["train", "--config", str(ROOT / recipe)] + ["--" + s for s in sample])
        assert unknown == ["--" + s for s in sample]  # main() turns these into overrides


def test_adapter_options_are_free_form_but_checked_by_the_adapter(tmp_path, tiny_dataset_dir):
    from toolgraph.data import prepare_dataset

    cfg = load_config(EvaluateConfig, overrides=["data.options.val_fraction=0.2", "data.options.corpus=colt"])
    assert cfg.data.options == {"val_fraction": 0.2, "corpus": "colt"}
    cfg = load_config(EvaluateConfig, overrides=[f"data.name={tiny_dataset_dir}", "data.options.bogus=1"])
    with pytest.raises(Exception, match="bogus"):
        prepare_dataset(cfg.data)


def test_unknown_option_of_a_registered_adapter_names_it(data_root):
    from toolgraph.data import load_dataset

    with pytest.raises(ConfigError, match=r"data.options: unknown option\(s\) \['val_fracton'\] for dataset 'toollens'"):
        load_dataset("toollens", data_root, val_fracton=0.2)


@pytest.mark.parametrize("schema, files, override, key", [
    ("eval", [{"retriever": {"name": "dense"}}], "retriever.index=annoy", "retriever.index"),
    ("eval", [{"retriever": {"name": "t2a"}}], "retriever.scorer=max", "retriever.scorer"),
    ("eval", [{"retriever": {"name": "tgr"}}], "retriever.direction=up", "retriever.direction"),
    ("eval", [], "retriever.tool_text=html", "retriever.tool_text"),
    ("eval", [], "eval.metrics=[recall,f1]", "eval.metrics"),
    ("eval", [], "eval.step_merge=mean", "eval.step_merge"),
    ("eval", [], "data.setting=inductive", "data.setting"),
    ("train", [{"model": {"name": "mlc"}}], "model.loss=focal", "model.loss"),
    ("train", [{"model": {"name": "graph"}}], "model.gnn=gcn", "model.gnn"),
    ("train", [{"model": {"name": "graph"}}], "model.edges=[invokes,likes]", "model.edges"),
    ("train", [], "optim.schedule=step", "optim.schedule"),
    ("train", [], "trainer.precision=8-bit", "trainer.precision"),
    ("train", [], "checkpoint.mode=best", "checkpoint.mode"),
])
def test_allowed_values_are_checked_when_the_config_loads(schema, files, override, key):
    """Choices are Literal[...] types: a wrong one fails at load time (before any model is built),
    naming the key and the override it came from."""
    from toolgraph.training import TrainConfig

    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config(EvaluateConfig if schema == "eval" else TrainConfig, files, [override])


def test_defaults_list_merges_presets_first_relative_to_the_file(tmp_path):
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "base.yaml").write_text("retriever: {name: bm25, k1: 1.2}\neval: {ks: [1, 5]}\n")
    (tmp_path / "run.yaml").write_text("defaults: [presets/base.yaml]\ndata: {name: metatool}\nretriever: {k1: 0.9}\n")
    cfg = load_config(EvaluateConfig, [tmp_path / "run.yaml"])
    assert (cfg.data.name, cfg.retriever.name, cfg.retriever.k1, cfg.eval.ks) == ("metatool", "bm25", 0.9, [1, 5])
    (tmp_path / "loop.yaml").write_text("defaults: [loop.yaml]\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(EvaluateConfig, [tmp_path / "loop.yaml"])
    (tmp_path / "missing.yaml").write_text("defaults: [nowhere.yaml]\n")
    with pytest.raises(ConfigError, match="nowhere.yaml: config file not found"):
        load_config(EvaluateConfig, [tmp_path / "missing.yaml"])


def test_parse_options_reads_yaml_values_and_names_a_bad_item():
    from toolgraph.config import parse_options

    assert parse_options(["levels=[1, 2]", "val_from=test", "val_fraction=0.3", "x="]) == {
        "levels": [1, 2], "val_from": "test", "val_fraction": 0.3, "x": None}
    with pytest.raises(ConfigError, match=r"--data-option 'val_from' is not of the form key=value"):
        parse_options(["val_from"], "--data-option")
    with pytest.raises(ConfigError, match="'=test'"):
        parse_options(["=test"])
