"""Every run schema, and the one way to turn YAML files, dicts and ``key=value`` overrides into one.

    cfg = load_config(EvaluateConfig, ["configs/eval/bm25_toollens.yaml"], ["eval.ks=[1,5]"])

* The dataclass is the schema: an unknown key, a value of the wrong type or a value outside its
  ``Literal[...]`` choices fails at load time with a ``ConfigError`` naming the key and the file (or
  ``override``) it came from.
* A section whose schema depends on its ``name`` (``retriever.name: dense``, ``model.name:
  bi_encoder``) gets the config class registered under that name, so each method validates its own
  keys. The registries import the method's home package by name (toolgraph/registry.py), so
  loading an evaluation config imports neither Lightning nor PyG.
* A YAML file may start with ``defaults: [preset.yaml, ...]`` (paths relative to that file): the
  presets are merged first, in order, then the file over them.
* ``--key=value`` is accepted as well as ``key=value`` (W&B sweep agents pass either).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from toolgraph.errors import ConfigError
from toolgraph.registry import RETRIEVERS, TASKS

# how a tool becomes text (data/schema.py render_tool): name: description + parameters (default),
# name and description only, ToolBench's JSON doc string, or default plus output field names (io)
ToolText = Literal["default", "name_desc", "toolbench", "io"]
MetricName = Literal["recall", "precision", "ndcg", "map", "pass", "mrr", "ndcg_toolbench"]
StepMerge = Literal["max", "interleave", "rrf"]
SETTING = re.compile(r"standard|transductive|(inductive|noise)-\d+")


# ---- data ---------------------------------------------------------------------------------------
@dataclass
class DataConfig:
    name: str = "toollens"  # registry name, or a folder in the canonical JSONL format
    root: str | None = None  # default: $TOOLGRAPH_DATA
    split: str = "test"  # the split evaluated
    setting: str = "standard"  # standard | transductive | inductive-<pct> | noise-<pct>
    seed: int = 0  # for the setting's random choices
    options: dict[str, Any] = field(default_factory=dict)  # adapter options (val_fraction, ...)

    def __post_init__(self) -> None:
        if not SETTING.fullmatch(str(self.setting)):
            raise ConfigError(f"data.setting: {self.setting!r} is not standard, transductive, inductive-<pct> "
                              "or noise-<pct>")


@dataclass
class TextDataConfig(DataConfig):
    batch_size: int = 32  # queries per batch per device
    eval_batch_size: int = 128
    max_query_length: int = 64  # training truncation (speed)
    max_tool_length: int = 128
    eval_max_query_length: int = 128  # val/test and the exported retriever: long queries kept whole
    num_workers: int = 0
    val_split: str = "val"  # the split validated on during fit
    test_split: str = "test"


# ---- evaluation ---------------------------------------------------------------------------------
@dataclass
class EvalConfig:
    ks: list[int] = field(default_factory=lambda: [1, 3, 5, 7, 10])
    metrics: list[MetricName] = field(default_factory=lambda: ["recall", "precision", "ndcg", "map", "pass", "mrr"])
    depth: int = 100  # tools retrieved per query (the curves go up to here)
    batch_size: int = 256  # queries per retrieve() call
    agent_level: bool = True  # also score agents (a tool's owner) when the dataset has them
    max_queries: int | None = None  # evaluate the first N queries of the split (smoke runs)
    query_mode: Literal["direct", "step-wise"] = "direct"  # step-wise: each step retrieved, then merged
    steps: Literal["annotated", "sentences", "auto"] = "auto"  # auto: annotated (Query.steps), else sentences
    step_merge: StepMerge = "max"  # retrieval/steps.py


@dataclass
class EvaluateConfig:
    data: DataConfig = field(default_factory=DataConfig)
    retriever: Any = None  # schema chosen by retriever.name (the retriever registry)
    eval: EvalConfig = field(default_factory=EvalConfig)
    out: str | None = None  # results folder


# ---- training -----------------------------------------------------------------------------------
@dataclass
class TaskConfig:
    """Base of every ``model:`` section; each task extends it with its own fields (tasks/*.py)."""

    name: str = ""


@dataclass
class OptimConfig:
    lr: float = 2e-5
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    warmup_steps: int | None = None  # overrides warmup_ratio when set
    warmup_ratio: float = 0.1
    schedule: Literal["linear", "cosine", "constant"] = "linear"  # after warmup


@dataclass
class TrainerConfig:
    accelerator: Literal["auto", "cpu", "gpu", "cuda", "mps", "tpu"] = "auto"
    devices: Any = "auto"  # int, list or "auto"
    num_nodes: int = 1
    strategy: str = "auto"  # auto | ddp | ddp_spawn | fsdp | deepspeed... (Lightning's names)
    precision: Literal["32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true"] = "32-true"
    max_epochs: int = 1
    max_steps: int = -1
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = 1.0
    val_check_interval: Any = 1.0  # float (share of an epoch) or int (batches)
    check_val_every_n_epoch: int | None = 1
    limit_train_batches: Any = None
    limit_val_batches: Any = None
    log_every_n_steps: int = 10
    deterministic: bool = False
    enable_progress_bar: bool = True
    num_sanity_val_steps: int = 0


@dataclass
class LoggerConfig:
    wandb: bool = True  # mode from the environment (WANDB_MODE=offline|disabled); never logs in
    csv: bool = True
    project: str = "toolgraph"
    run_name: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class CheckpointConfig:
    monitor: str = "val/recall@5"  # checked against what model.name logs when training starts
    mode: Literal["max", "min"] = "max"
    save_top_k: int = 1
    every_n_train_steps: int | None = None  # also save last.ckpt every N steps (mid-epoch resume)


@dataclass
class TrainConfig:
    model: Any = None  # schema chosen by model.name (the task registry)
    data: TextDataConfig = field(default_factory=TextDataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    seed: int = 0
    out_dir: str = "runs/default"
    resume: str | None = None  # "auto" (out_dir/checkpoints/last.ckpt if present) or a path
    test: bool = True
    export: bool = True


# ---- loading ------------------------------------------------------------------------------------
def _retriever_schema(name: str) -> Any:
    return RETRIEVERS.get(name).Config(name=name)


def _task_schema(name: str) -> Any:
    return TASKS.get(name).Config(name=name)


# section -> (default name, name -> schema instance)
POLYMORPHIC: dict[str, tuple[str, Callable[[str], Any]]] = {
    "retriever": ("bm25", _retriever_schema),
    "model": ("bi_encoder", _task_schema),
}

# dict-typed fields whose keys are not part of the schema (adapter options)
OPEN_SECTIONS = ("data.options",)


def parse_overrides(args: Sequence[str]) -> list[str]:
    """Turn ``--a.b=1`` / ``a.b=1`` into OmegaConf dotlist entries; anything else is an error."""
    out = []
    for arg in args:
        item = arg[2:] if arg.startswith("--") else arg
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {arg!r} is not of the form key=value")
        out.append(item)
    return out


def load_yaml(path: str | Path) -> DictConfig:
    """A YAML mapping file; errors name the file (and the line of a syntax error)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: invalid YAML: {getattr(e, 'problem', e)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return OmegaConf.create(data)


def yaml_sources(path: str | Path, _seen: tuple[Path, ...] = ()) -> list[tuple[str, DictConfig]]:
    """``path`` preceded by the presets its ``defaults:`` list names (recursively, in order)."""
    path = Path(path)
    if path.resolve() in _seen:
        raise ConfigError(f"{path}: defaults form a cycle ({' -> '.join(str(p) for p in (*_seen, path))})")
    node = load_yaml(path)
    presets = node.pop("defaults", None) if "defaults" in node else []
    if isinstance(presets, str):
        presets = [presets]
    if not OmegaConf.is_list(presets) and not isinstance(presets, list):
        raise ConfigError(f"{path}: key 'defaults' must be a list of YAML paths relative to the file")
    out: list[tuple[str, DictConfig]] = []
    for preset in presets:
        if not isinstance(preset, str):
            raise ConfigError(f"{path}: key 'defaults': entries must be paths, got {preset!r}")
        out += yaml_sources(path.parent / preset, (*_seen, path.resolve()))
    return out + [(str(path), node)]


def load_config(schema: Any, files: Sequence[str | Path | Mapping] = (), overrides: Sequence[str] = (),
                where: str = "saved config") -> Any:
    """Merge ``files`` (YAML paths, or plain dicts named ``where`` in errors) then ``overrides`` over
    ``schema``'s defaults (a dataclass or an instance of one); return the typed object."""
    sources: list[tuple[str, DictConfig]] = []
    for f in files:
        if isinstance(f, Mapping):
            try:
                sources.append((where, OmegaConf.create(dict(f))))
            except OmegaConfBaseException as e:
                raise ConfigError(f"{where}: {str(e).splitlines()[0]}") from None
        else:
            sources += yaml_sources(f)
    dotlist = parse_overrides(overrides)
    try:
        sources += [(f"override {item!r}", OmegaConf.from_dotlist([item])) for item in dotlist]
    except OmegaConfBaseException as e:
        raise ConfigError(f"overrides: {e}") from None

    base = OmegaConf.structured(schema)
    for section, (default, make) in POLYMORPHIC.items():
        if section not in base or base.get(section) is not None:  # only the open slots of run schemas
            continue
        name = default
        for _, src in sources:  # the last source that names the section's kind wins
            node = src.get(section)
            if isinstance(node, DictConfig) and node.get("name") is not None:
                name = node.get("name")
        try:
            base[section] = OmegaConf.structured(make(str(name)))
        except ConfigError as e:
            raise ConfigError(f"{section}.name: {e}") from None
    OmegaConf.set_struct(base, True)
    for key in OPEN_SECTIONS:  # free-form dicts: their keys belong to the adapter, checked there
        node = OmegaConf.select(base, key)
        if node is not None:
            OmegaConf.set_struct(node, False)
    for src_name, src in sources:
        try:
            base = OmegaConf.merge(base, src)
        except OmegaConfBaseException as e:
            key = getattr(e, "full_key", None) or "?"
            msg = str(e).splitlines()[0]
            raise ConfigError(f"{src_name}: key '{key}': {msg}") from None
    try:
        return OmegaConf.to_object(base)
    except OmegaConfBaseException as e:
        raise ConfigError(f"key '{getattr(e, 'full_key', '?')}': {str(e).splitlines()[0]}") from None


def from_dict(schema: Any, values: Mapping[str, Any], where: str = "saved config") -> Any:
    """A typed config from a plain dict (a checkpoint's hyperparameters, a saved retriever's
    retriever.json), validated by ``schema`` exactly like a YAML file."""
    return load_config(schema, [values], where=where)


def config_from_dict(values: Mapping[str, Any]) -> TrainConfig:
    """The TrainConfig a checkpoint carries (``hyper_parameters.config``)."""
    return from_dict(TrainConfig, values, "checkpoint config")


def to_yaml(cfg: Any) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: Any) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]
