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
* Values are range-checked at load: a field declared with ``bounded(...)`` (``lr: float = bounded(2e-5,
  gt=0)``; for a list, each item) and a schema's ``validate()`` (rules between fields, e.g.
  ``eval.depth >= max(eval.ks)``) fail with a ``ConfigError`` naming the full key (``optim.lr``).
* Renamed keys keep loading: a schema's ``renamed`` table (old key -> new key path, e.g. ``{"model":
  "encoder.name"}``) moves the old keys of every source (YAML, saved dicts, overrides) before merging; a
  source that sets both is a ``ConfigError`` naming both. A section with a ``shorthand``
  (``TextEncoderSpec``) takes a plain string: ``retriever.encoder: all-MiniLM-L6-v2``.
* ``${...}`` interpolation is resolved only in what the user writes (``--config`` YAML files and
  overrides). Plain dicts are saved configs (a checkpoint's, ``retriever.json``, an index config) and are
  never resolved: a ``${...}`` in one is refused, so ``${oc.env:SECRET}`` cannot end up in a saved file.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from types import UnionType
from typing import Any, ClassVar, Literal, Union, get_args, get_origin, get_type_hints

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from toolgraph.errors import ConfigError
from toolgraph.registry import RETRIEVERS, TASKS

# how a tool becomes text (data/schema.py render_tool): name: description + parameters (default),
# name and description only, ToolBench's JSON doc string, or default plus output field names (io)
ToolText = Literal["default", "name_desc", "toolbench", "io"]
MetricName = Literal["recall", "precision", "ndcg", "map", "pass", "mrr", "ndcg_toolbench"]
StepMerge = Literal["max", "interleave", "rrf"]
QuerySplit = Literal["none", "sentences", "clauses"]  # the keys of retrieval/steps.py SPLITS
SETTING = re.compile(r"standard|transductive|(inductive|noise)-\d+|crossfit-\d+-\d+")


# ---- value checks -------------------------------------------------------------------------------
def _describe_range(gt: float | None, ge: float | None, lt: float | None, le: float | None) -> str:
    parts = [f"> {gt}" if gt is not None else "", f">= {ge}" if ge is not None else "",
             f"< {lt}" if lt is not None else "", f"<= {le}" if le is not None else ""]
    return " and ".join(p for p in parts if p)


def in_range(value: Any, gt: float | None = None, ge: float | None = None, lt: float | None = None,
             le: float | None = None) -> str | None:
    """What is wrong with ``value`` as a finite number within the bounds (None: nothing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number, got {value!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    if (gt is not None and not value > gt) or (ge is not None and not value >= ge) \
            or (lt is not None and not value < lt) or (le is not None and not value <= le):
        return f"must be {_describe_range(gt, ge, lt, le)}, got {value!r}"
    return None


def bounded(default: Any = MISSING, *, factory: Callable[[], Any] | None = None, gt: float | None = None,
            ge: float | None = None, lt: float | None = None, le: float | None = None, nonempty: bool = False,
            length: int | None = None, check: Callable[[Any], str | None] | None = None) -> Any:
    """A dataclass field whose value ``load_config`` range-checks (``None`` always passes, for optional
    fields); for a list, each item is checked, and ``nonempty`` / ``length`` constrain its size.
    ``check(value)`` returns what is wrong with other values (None: fine)::

        lr: float = bounded(2e-5, gt=0)
        ks: list[int] = bounded(factory=lambda: [1, 5], ge=1, nonempty=True)
    """

    def problem(value: Any) -> str | None:
        if check is not None:
            return check(value)
        if isinstance(value, (list, tuple)):
            if nonempty and not value:
                return "must not be empty"
            if length is not None and len(value) != length:
                return f"must have {length} items, got {len(value)}"
            for item in value:
                msg = in_range(item, gt, ge, lt, le)
                if msg:
                    return f"every item {msg}"
            return None
        return in_range(value, gt, ge, lt, le)

    meta = {"check": problem}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


class InvalidValue(ValueError):
    """A value outside its range; ``key`` is the full dotted key (``optim.lr``)."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"key '{key}': {problem}")
        self.key, self.problem = key, problem


def _choices(hint: Any) -> tuple[tuple, bool] | None:
    """(allowed values, whether the field is a list of them) of a ``Literal`` field type (also inside
    ``list[...]`` or ``| None``); None for any other type."""
    args = [a for a in get_args(hint) if a is not type(None)] if get_origin(hint) in (Union, UnionType) else [hint]
    if len(args) != 1:
        return None
    hint = args[0]
    if get_origin(hint) is list and get_args(hint):
        inner = _choices(get_args(hint)[0])
        return (inner[0], True) if inner and not inner[1] else None
    return (get_args(hint), False) if get_origin(hint) is Literal else None


@functools.cache
def _literal_fields(cls: type) -> dict[str, tuple[tuple, bool]]:
    try:
        hints = get_type_hints(cls)
    except (NameError, TypeError):  # a type this module cannot resolve: OmegaConf checks it at load
        return {}
    return {name: c for name, hint in hints.items() if (c := _choices(hint)) is not None}


def _wrong_choice(value: Any, allowed: tuple, many: bool) -> str | None:
    for v in (value if many and isinstance(value, (list, tuple)) else [value]):
        if v not in allowed:
            return f"must be one of {', '.join(map(repr, allowed))}, got {v!r}"
    return None


def invalid_values(cfg: Any, prefix: str = "") -> Iterator[InvalidValue]:
    """Every value of the typed config ``cfg`` (nested sections included) that breaks its field's
    ``Literal`` choices, its ``bounded`` range or its class's ``validate()`` rules. ``load_config``
    has OmegaConf check the choices as it merges; this catches a config built in code."""
    if not is_dataclass(cfg) or isinstance(cfg, type):
        return
    choices = _literal_fields(type(cfg))
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if f.name in choices and value is not None:
            problem = _wrong_choice(value, *choices[f.name])
            if problem:
                yield InvalidValue(prefix + f.name, problem)
                continue
        rule = f.metadata.get("check")
        if rule is not None and value is not None:
            problem = rule(value)
            if problem:
                yield InvalidValue(prefix + f.name, problem)
        yield from invalid_values(value, f"{prefix}{f.name}.")
    validate = getattr(cfg, "validate", None)
    if callable(validate):
        for name, problem in validate():
            yield InvalidValue(prefix + name, problem)


def check_values(cfg: Any, prefix: str = "") -> Any:
    """``cfg`` unchanged, or the ConfigError of its first out-of-range value (``key 'optim.lr': must be
    > 0, got 0.0``). ``load_config`` calls it; call it on a config built in code to check it the same way."""
    for bad in invalid_values(cfg, prefix):
        raise ConfigError(str(bad))
    return cfg


def _int_or_share(what: str) -> Callable[[Any], str | None]:
    """Lightning's limit_*_batches style: null, a count >= 0, or a share of the batches in [0, 1]."""

    def check(value: Any) -> str | None:
        if isinstance(value, int) and not isinstance(value, bool):
            return None if value >= 0 else f"must be >= 0 {what}, got {value!r}"
        if isinstance(value, float):
            return None if 0.0 <= value <= 1.0 else f"a share of {what} must be in [0, 1], got {value!r}"
        return f"must be a number of {what} (int >= 0) or a share of them (float in [0, 1]), got {value!r}"

    return check


DURATION = re.compile(r"\d+:\d{1,2}:\d{1,2}:\d{1,2}")  # DD:HH:MM:SS (Lightning's time-based validation)


def _val_check_interval(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return None if value >= 1 else f"a number of training batches must be >= 1, got {value!r}"
    if isinstance(value, float):
        return None if 0.0 < value <= 1.0 else f"a share of an epoch must be in (0, 1], got {value!r}"
    if isinstance(value, str) and DURATION.fullmatch(value):
        return None
    return ("must be a share of an epoch (float in (0, 1]), a number of training batches (int >= 1) or a "
            f"duration 'DD:HH:MM:SS', got {value!r}")


def _devices(value: Any) -> str | None:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and (value >= 1 or value == -1)):
        return None
    if isinstance(value, str) and re.fullmatch(r"-1|\d+|\d+(,\d*)+", value.strip()) and value.strip() != "0":
        return None  # Lightning's "2", "-1", "0,1"
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                 for v in value):
        return None
    return f"must be 'auto', a device count >= 1 (or -1: all), or a list of device indices, got {value!r}"


# a ``${`` that OmegaConf would resolve: preceded by an even number of backslashes (``\${`` is a literal)
_INTERPOLATION = re.compile(r"(?<!\\)(?:\\\\)*\$\{")
_OPENING = re.compile(r"(\\*)\$\{")


def escape_literals(values: Any) -> Any:
    r"""``values`` with every ``${`` in its strings escaped (``\${``, backslashes before it doubled), so
    that OmegaConf reads each string back as the literal it is: the form in which toolgraph saves a
    config (checkpoints, retriever.json, config.yaml). A value the user wrote as ``\${x}`` trains,
    saves and loads as ``${x}``; nothing saved is ever resolved."""
    if isinstance(values, str):
        return _OPENING.sub(lambda m: m.group(1) * 2 + "\\${", values)
    if isinstance(values, Mapping):
        return {k: escape_literals(v) for k, v in values.items()}
    if isinstance(values, (list, tuple)):
        return [escape_literals(v) for v in values]
    return values


def no_interpolation(values: Any, where: str, key: str = "") -> None:
    r"""Refuse any ``${...}`` in ``values`` (a saved config's plain data): it would be resolved on load,
    e.g. ``${oc.env:SECRET}`` read from the environment and written back into a saved file. An escaped
    ``\${`` (``escape_literals``: how toolgraph saves a literal ``${``) is a literal and passes."""
    if isinstance(values, str):
        if _INTERPOLATION.search(values):
            raise ConfigError(f"{where}: key '{key or '?'}': {values[:80]!r} is an interpolation; saved configs "
                              "(checkpoints, retriever.json, index configs) are never resolved: write the value "
                              "itself")
    elif isinstance(values, Mapping):
        for k, v in values.items():
            if isinstance(k, str) and "${" in k:
                raise ConfigError(f"{where}: key {k[:80]!r} is an interpolation; saved configs are never resolved")
            no_interpolation(v, where, f"{key}.{k}" if key else str(k))
    elif isinstance(values, (list, tuple)):
        for i, v in enumerate(values):
            no_interpolation(v, where, f"{key}[{i}]")


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
            raise ConfigError(f"data.setting: {self.setting!r} is not standard, transductive, inductive-<pct>, "
                              "noise-<pct> or crossfit-<k>-<fold>")


@dataclass
class TextDataConfig(DataConfig):
    batch_size: int = bounded(32, ge=1)  # queries per batch per device
    eval_batch_size: int = bounded(128, ge=1)
    max_query_length: int = bounded(64, ge=1)  # training truncation (speed)
    max_tool_length: int = bounded(128, ge=1)
    eval_max_query_length: int = bounded(128, ge=1)  # val/test and the exported retriever: long queries kept whole
    num_workers: int = bounded(0, ge=0)
    bucket_by_length: bool = False  # training batches of queries of similar length (less padding)
    mixture_temperature: float = bounded(2.0, gt=0)  # data.name mixture: dataset g drawn ∝ n_g^(1/T) (1 = by size)
    # training queries a tool is the positive of, at most, in one pass over a dataset (seeded draw each pass;
    # None: all): a tool with thousands of queries no longer fills its dataset's batches
    max_queries_per_tool: int | None = bounded(None, ge=1)
    val_split: str = "val"  # the split validated on during fit
    test_split: str = "test"


# ---- text encoders ------------------------------------------------------------------------------
@dataclass
class TextEncoderSpec:
    """A text encoder, as every section that encodes text names it (``retriever.encoder``,
    ``model.encoder``, a graph's node text ...): which model, how its token states become one vector,
    how texts are cut and prefixed, and where the vectors are cached. A plain string stands for
    ``{name: <string>}`` (``retriever.encoder: all-MiniLM-L6-v2``), merged over the section's defaults."""

    shorthand: ClassVar[str] = "name"  # load_config: a plain string for this section sets this key

    name: str = "all-MiniLM-L6-v2"  # a Hugging Face id, a local folder, or a packaged name (toolgraph-general)
    pooling: Literal["mean", "cls"] = "mean"
    normalize: bool = True  # L2-normalised vectors (cosine scores)
    max_length: int = bounded(256, ge=1)  # tokens per tool document
    max_query_length: int | None = bounded(None, ge=1)  # tokens per query (None: max_length)
    query_prefix: str | None = None  # before each query, e.g. "query: "; None: the model folder's "query" prompt
    doc_prefix: str | None = None  # before each tool document; None: the folder's "document" prompt (else none)
    cache_dir: str | None = ".cache/embeddings"  # the embedding cache (text -> vector); null: in memory only


def encoder_spec(**values: Any) -> Callable[[], TextEncoderSpec]:
    """A ``default_factory`` for a section's ``encoder`` with its own defaults:
    ``encoder: TextEncoderSpec = field(default_factory=encoder_spec(max_length=128))``."""
    return functools.partial(TextEncoderSpec, **values)


def unread_keys(spec: Any, default: Any, keys: Sequence[str], why: str,
                prefix: str = "encoder.") -> Iterator[tuple[str, str]]:
    """``validate()`` rules of a section whose ``spec`` (e.g. its TextEncoderSpec) has keys the section
    does not read (a training task truncates by ``data.*`` lengths): each one set off the section's
    ``default`` is refused, saying ``why``, so no setting is silently ignored."""
    for key in keys:
        if getattr(spec, key) != getattr(default, key):
            yield f"{prefix}{key}", f"is not read here ({why}); leave it out"


# ---- evaluation ---------------------------------------------------------------------------------
@dataclass
class EvalConfig:
    ks: list[int] = bounded(factory=lambda: [1, 3, 5, 7, 10], ge=1, nonempty=True)
    metrics: list[MetricName] = bounded(factory=lambda: ["recall", "precision", "ndcg", "map", "pass", "mrr"],
                                        check=lambda v: None if v else "must name at least one metric")
    depth: int = bounded(100, ge=1)  # tools retrieved per query (the curves go up to here); >= max(ks)
    batch_size: int = bounded(256, ge=1)  # queries per retrieve() call
    agent_level: bool = True  # also score agents (a tool's owner) when the dataset has them
    max_queries: int | None = bounded(None, ge=1)  # evaluate the first N queries of the split (smoke runs)
    query_mode: Literal["direct", "step-wise"] = "direct"  # step-wise: each step retrieved, then merged
    steps: Literal["annotated", "sentences", "auto"] = "auto"  # auto: annotated (Query.steps), else sentences
    step_merge: StepMerge = "max"  # retrieval/steps.py
    # resamples of the queries for a 95 % percentile-bootstrap interval of every metric (results.json
    # "intervals"; toolgraph.metrics.intervals); 0: none
    bootstrap: int = bounded(1000, ge=0)

    def validate(self) -> Iterator[tuple[str, str]]:
        if self.ks and self.depth < max(self.ks):
            yield "depth", f"must be >= max(eval.ks) = {max(self.ks)} (the deepest cut-off scored), got {self.depth}"


@dataclass
class EvaluateConfig:
    data: DataConfig = field(default_factory=DataConfig)
    retriever: Any = None  # schema chosen by retriever.name (the retriever registry)
    eval: EvalConfig = field(default_factory=EvalConfig)
    out: str | None = None  # results folder
    # a saved model to evaluate instead of building ``retriever`` (.ckpt, run folder or saved retriever;
    # evaluate --checkpoint); the results then record the loaded retriever's own config under ``retriever``
    checkpoint: str | None = None


# ---- training -----------------------------------------------------------------------------------
@dataclass
class TaskConfig:
    """Base of every ``model:`` section; each task extends it with its own fields (tasks/*.py)."""

    name: str = ""


@dataclass
class OptimConfig:
    lr: float = bounded(2e-5, gt=0)
    weight_decay: float = bounded(0.01, ge=0)
    betas: list[float] = bounded(factory=lambda: [0.9, 0.999], ge=0, lt=1, length=2)
    eps: float = bounded(1e-8, gt=0)
    warmup_steps: int | None = bounded(None, ge=0)  # overrides warmup_ratio when set
    warmup_ratio: float = bounded(0.1, ge=0, le=1)
    schedule: Literal["linear", "cosine", "constant"] = "linear"  # after warmup


def _max_time(v: Any) -> str | None:
    if v is None or (isinstance(v, str) and re.fullmatch(r"\d{2}:\d{2}:\d{2}:\d{2}", v)):
        return None
    return f"must be a wall-clock limit as DD:HH:MM:SS (e.g. 00:01:00:00 for one hour), got {v!r}"


@dataclass
class TrainerConfig:
    accelerator: Literal["auto", "cpu", "gpu", "cuda", "mps", "tpu"] = "auto"
    devices: Any = bounded("auto", check=_devices)  # int, list or "auto"
    num_nodes: int = bounded(1, ge=1)
    strategy: str = "auto"  # auto | ddp | ddp_spawn | fsdp | deepspeed... (Lightning's names)
    precision: Literal["32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true"] = "32-true"
    max_epochs: int = bounded(1, ge=-1)  # -1: no limit
    max_steps: int = bounded(-1, ge=-1)  # -1: no limit
    max_time: str | None = bounded(None, check=_max_time)  # "DD:HH:MM:SS": stop after this much wall-clock time
    accumulate_grad_batches: int = bounded(1, ge=1)
    gradient_clip_val: float | None = bounded(1.0, ge=0)
    val_check_interval: Any = bounded(1.0, check=_val_check_interval)  # float (share of an epoch) or int (batches)
    check_val_every_n_epoch: int | None = bounded(1, ge=1)
    limit_train_batches: Any = bounded(None, check=_int_or_share("training batches"))
    limit_val_batches: Any = bounded(None, check=_int_or_share("validation batches"))
    log_every_n_steps: int = bounded(10, ge=1)
    deterministic: bool = False
    enable_progress_bar: bool = True
    num_sanity_val_steps: int = bounded(0, ge=-1)
    # weights averaged as an exponential moving average (decay per optimizer step; Lightning's
    # EMAWeightAveraging): validation, checkpoints and the exported retriever use the average
    ema_decay: float | None = bounded(None, gt=0, lt=1)


@dataclass
class LoggerConfig:
    wandb: bool = True  # mode from the environment (WANDB_MODE=offline|disabled); never logs in
    csv: bool = True
    project: str = "toolgraph"
    run_name: str | None = None
    tags: list[str] = field(default_factory=list)
    group: str | None = None  # W&B run group (toolgraph sweep: the study's name)


@dataclass
class CheckpointConfig:
    monitor: str = "val/recall@5"  # checked against what model.name logs when training starts
    mode: Literal["max", "min"] = "max"
    save_top_k: int = bounded(1, ge=-1)  # -1: keep all
    every_n_train_steps: int | None = bounded(None, ge=1)  # also save last.ckpt every N steps (mid-epoch resume)


@dataclass
class TrainConfig:
    model: Any = None  # schema chosen by model.name (the task registry)
    data: TextDataConfig = field(default_factory=TextDataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    seed: int = bounded(0, ge=0, le=2**32 - 1)  # NumPy's seed (L.seed_everything) takes 32 bits
    out_dir: str = bounded("runs/default", check=lambda v: None if str(v).strip() else "must name a folder")
    resume: str | None = None  # "auto" (the newest last*.ckpt in out_dir/checkpoints, if any) or a path
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


# ---- renamed keys -------------------------------------------------------------------------------
# A schema may declare ``renamed: ClassVar[dict[str, str]]``: old key -> its new key path, both relative
# to the schema's section (``{"model": "encoder.name", "tool_prefix": "encoder.doc_prefix"}``). Tables
# are inherited (a subclass's entries added to its bases'). load_config moves the old keys of every
# source (YAML files, saved dicts: checkpoints, retriever.json; overrides) to their new place before
# merging, in the schema's own section, its nested sections and the open slots (``retriever``,
# ``model``) by the class their ``name`` picks; so files written before a rename load to the same
# values, and files saved since carry the new keys only. A nested section whose class has a
# ``shorthand: ClassVar[str]`` takes a plain string for ``{shorthand: <string>}`` (TextEncoderSpec).
# A schema's ``retriever_slots: ClassVar[tuple[str, ...]]`` names its fields that hold an inline
# retriever config (a pipeline's first stage, an agent index's dense encoder): such a dict is renamed
# by the class its ``name`` picks (in any source), so ``retriever.dense.model=x`` still merges into a
# ``dense: {name: dense, encoder: {...}}`` written with the new keys.
def renames_of(cls: type) -> dict[str, str | tuple[str, ...]]:
    """``cls``'s ``renamed`` table with those of its bases (old key -> new key path, or a tuple of paths
    when one old setting became several, e.g. one cache for two encoders)."""
    out: dict[str, str | tuple[str, ...]] = {}
    for c in reversed(cls.__mro__):
        out.update(vars(c).get("renamed", {}))
    return out


def _targets(new: str | tuple[str, ...]) -> tuple[str, ...]:
    return (new,) if isinstance(new, str) else tuple(new)


def _dataclass_of(hint: Any) -> type | None:
    args = [a for a in get_args(hint) if a is not type(None)] if get_origin(hint) in (Union, UnionType) else [hint]
    return args[0] if len(args) == 1 and isinstance(args[0], type) and is_dataclass(args[0]) else None


@functools.cache
def _sections_of(cls: type) -> dict[str, type]:
    """The fields of the dataclass ``cls`` typed as a dataclass (``X`` or ``X | None``): its nested sections."""
    if not is_dataclass(cls):
        return {}
    try:
        hints = get_type_hints(cls)
    except (NameError, TypeError):
        return {}
    own = {f.name for f in fields(cls)}
    return {n: sub for n, h in hints.items() if n in own and (sub := _dataclass_of(h)) is not None}


def _expand(sub: type | None, value: Any) -> Any:
    """``{shorthand: value}`` for a plain string given for a section of class ``sub`` that has a shorthand."""
    short = getattr(sub, "shorthand", None) if sub is not None else None
    return {short: value} if short and isinstance(value, str) else value


def rename_keys(cls: type, data: dict, where: str, prefix: str = "", sections: Mapping[str, type] | None = None,
                names: Mapping[str, str] | None = None) -> bool:
    """Move the old keys of ``data`` (plain data for a ``cls`` section, changed in place) to their new
    paths by the ``renamed`` tables of ``cls`` and of its nested sections (``sections``: the classes of
    open slots such as ``retriever``, picked by their names; ``names``: full dotted key -> the ``name``
    the sources give an inline retriever there), and expand shorthands; True if anything changed. A
    source that sets both an old key and its new one is a ConfigError naming both."""
    nested = {**_sections_of(cls), **(sections or {})}
    for slot in getattr(cls, "retriever_slots", ()):
        member = data.get(slot)
        if slot not in nested and isinstance(member, dict):
            name = member.get("name") if isinstance(member.get("name"), str) else (names or {}).get(prefix + slot)
            if isinstance(name, str) and name in RETRIEVERS:
                nested[slot] = RETRIEVERS.get(name).Config
    changed = False
    for key, sub in nested.items():
        if key in data and (value := _expand(sub, data[key])) is not data[key]:
            data[key], changed = value, True
    for old, targets in renames_of(cls).items():
        if old not in data:
            continue
        value = data.pop(old)
        for new in _targets(targets):
            *path, last = new.split(".")
            node, owner, walked = data, None, prefix
            for i, part in enumerate(path):
                sub = (nested if i == 0 else _sections_of(owner) if owner is not None else {}).get(part)
                child = _expand(sub, node.get(part, {}))
                if not isinstance(child, dict):
                    raise ConfigError(f"{where}: key '{prefix}{old}' is the old name of '{prefix}{new}', but "
                                      f"'{walked}{part}' is {child!r}, not a section to move it into")
                node[part], node, owner, walked = child, child, sub, f"{walked}{part}."
            if last in node:
                raise ConfigError(f"{where}: keys '{prefix}{old}' and '{prefix}{new}' are one setting ('{old}' is "
                                  f"its old name) and both are set; keep only '{prefix}{new}'")
            node[last] = value
        changed = True
    for key, sub in nested.items():
        if isinstance(data.get(key), dict):
            changed |= rename_keys(sub, data[key], where, f"{prefix}{key}.", names=names)
    return changed


def _names(data: Any, prefix: str, out: dict[str, str]) -> None:
    """``out[dotted key] = name`` for every mapping in ``data`` with a string ``name``."""
    if isinstance(data, dict):
        if isinstance(data.get("name"), str) and prefix:
            out[prefix[:-1]] = data["name"]
        for k, v in data.items():
            _names(v, f"{prefix}{k}.", out)


def _renamed_sources(cls: type, sources: list[tuple[str, DictConfig]],
                     sections: Mapping[str, type]) -> list[tuple[str, DictConfig]]:
    """Every source with its old keys moved to their new paths (``rename_keys``); a source with none
    is returned as it is."""
    plain = []
    for where, src in sources:
        try:
            plain.append(OmegaConf.to_container(src, resolve=False))
        except OmegaConfBaseException as e:
            raise ConfigError(f"{where}: {str(e).splitlines()[0]}") from None
    names: dict[str, str] = {}
    for data in plain:  # the last source that names an inline retriever picks its class
        _names(data, "", names)
    out = []
    for (where, src), data in zip(sources, plain, strict=True):
        if isinstance(data, dict) and rename_keys(cls, data, where, sections=sections, names=names):
            try:
                src = OmegaConf.create(data)
            except OmegaConfBaseException as e:
                raise ConfigError(f"{where}: {str(e).splitlines()[0]}") from None
        out.append((where, src))
    return out


def accepts_renamed(cls: type) -> type:
    """Class decorator, above ``@dataclass``: code written against the old keys keeps working. ``cls``
    may be built with the old keyword names of its ``renamed`` table, and a plain string for a section
    with a shorthand, as files may: ``DenseConfig(model="x", max_length=64)`` is
    ``DenseConfig(encoder=TextEncoderSpec(name="x", max_length=64, <the section's other encoder
    defaults>))``; and an old name that moved into a nested section reads and sets its new key
    (``cfg.model`` is ``cfg.encoder.name``; a plain rename such as ``cache_dir`` -> ``states_dir`` gets
    no alias). These aliases are not fields: the schema, and every file saved, has the new keys only.
    (A subclass gets its own ``__init__`` from ``@dataclass``: decorate it too.)"""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **_renamed_kwargs(cls, kwargs))

    cls.__init__ = __init__  # type: ignore[method-assign]
    own = {f.name for f in fields(cls)}
    for old, new in renames_of(cls).items():
        targets = _targets(new)
        if "." not in old and old not in own and all("." in t for t in targets) \
                and isinstance(getattr(cls, old, None), (property, type(None))):
            setattr(cls, old, _alias(targets))  # (a subclass's table may map an old name elsewhere)
    return cls


def _alias(paths: tuple[str, ...]) -> property:
    """A property reading the dotted key ``paths[0]`` of its object and setting every one of ``paths``."""

    def owner(obj: Any, path: str) -> tuple[Any, str]:
        *parents, last = path.split(".")
        for part in parents:
            obj = getattr(obj, part)
        return obj, last

    def set_all(obj: Any, value: Any) -> None:
        for path in paths:
            setattr(*owner(obj, path), value)

    return property(lambda self: getattr(*owner(self, paths[0])), set_all,
                    doc=f"the old name of ``{', '.join(paths)}``")


def _renamed_kwargs(cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    table, nested = renames_of(cls), _sections_of(cls)
    if not any(k in table or (k in nested and isinstance(v, (str, dict))) for k, v in kwargs.items()):
        return kwargs
    out, moved = dict(kwargs), {}
    for old, targets in table.items():
        if old not in out:
            continue
        value = out.pop(old)
        for new in _targets(targets):
            head, _, rest = new.partition(".")
            if not rest:
                if head in out:
                    raise ConfigError(f"{cls.__name__}: '{old}' is the old name of '{new}'; give only '{new}'")
                out[head] = value
            else:
                moved.setdefault(head, {})[rest] = value
    for key, sub in nested.items():
        if key not in out and key not in moved:
            continue
        value, sets = _expand(sub, out.get(key, MISSING)), moved.get(key, {})
        if is_dataclass(value) and not isinstance(value, type):
            if sets:
                raise ConfigError(f"{cls.__name__}: give {key}= or its old keys ({', '.join(renames_of(cls))}), "
                                  "not both")
            continue
        given = value if isinstance(value, dict) else {}
        both = [k for k in sets if k in given]
        if both:
            raise ConfigError(f"{cls.__name__}: '{key}.{both[0]}' is given twice (once by its old name)")
        out[key] = _with(_default_of(cls, key), {**given, **sets})
    return out


def _default_of(cls: type, name: str) -> Any:
    f = next(f for f in fields(cls) if f.name == name)
    return f.default_factory() if f.default_factory is not MISSING else f.default


def _with(obj: Any, values: Mapping[str, Any]) -> Any:
    """``obj`` (a dataclass instance) with ``values`` set; keys may be dotted paths into nested sections,
    and a nested section may be given as a dict or as its shorthand string."""
    flat: dict[str, Any] = {}
    deeper: dict[str, dict[str, Any]] = {}
    for key, v in values.items():
        head, _, rest = key.partition(".")
        if rest:
            deeper.setdefault(head, {})[rest] = v
        else:
            flat[head] = v
    for key, v in list(flat.items()):
        current = getattr(obj, key)
        if is_dataclass(current) and not isinstance(current, type):
            v = _expand(type(current), v)
            if isinstance(v, dict):
                flat[key] = _with(current, v)
    for head, sub in deeper.items():
        flat[head] = _with(flat.get(head, getattr(obj, head)), sub)
    return replace(obj, **flat)


def parse_options(items: Sequence[str], what: str = "option") -> dict[str, Any]:
    """``["levels=[1]", "val_from=test"]`` -> ``{"levels": [1], "val_from": "test"}``: free-form
    ``key=value`` options (a dataset's, a graph's), each value read as YAML."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{what} {item!r} is not of the form key=value")
        try:
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise ConfigError(f"{what} {item!r}: invalid YAML: {getattr(e, 'problem', e)}") from None
        check_expanded_size(out[key], f"{what} {item!r}")
    return out


def parse_overrides(args: Sequence[str]) -> list[str]:
    """Turn ``--a.b=1`` / ``a.b=1`` into OmegaConf dotlist entries; anything else is an error."""
    out = []
    for arg in args:
        item = arg[2:] if arg.startswith("--") else arg
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {arg!r} is not of the form key=value")
        out.append(item)
    return out


MAX_NODES = 100_000  # values one config source may hold once its YAML aliases are expanded


def check_expanded_size(data: Any, where: str) -> None:
    """A ConfigError if ``data`` (parsed YAML) holds more than ``MAX_NODES`` values once its aliases
    are expanded, as OmegaConf expands them: 400 bytes of nested aliases (``b: [*a, *a, ...]``) make
    ten million nodes and minutes of work. Counted without expanding (each shared node once), so the
    check itself is instant; an alias that contains itself is named as such."""
    sizes: dict[int, int] = {}

    def size(x: Any) -> int:
        if not isinstance(x, (dict, list)):
            return 1
        if id(x) in sizes:
            if sizes[id(x)] < 0:
                raise ConfigError(f"{where}: a YAML alias refers to itself")
            return sizes[id(x)]
        sizes[id(x)] = -1  # being counted: met again below means a cycle
        items = [*x.keys(), *x.values()] if isinstance(x, dict) else x
        n = 1 + sum(size(v) for v in items)
        sizes[id(x)] = n
        if n > MAX_NODES:
            raise ConfigError(f"{where}: more than {MAX_NODES:,} values once its YAML aliases are expanded (nested "
                              "aliases?); write the values out, a config needs far fewer")
        return n

    try:
        size(data)
    except RecursionError:
        raise ConfigError(f"{where}: invalid YAML: nested too deeply") from None


def load_yaml(path: str | Path) -> DictConfig:
    """A YAML mapping file; errors name the file (and the line of a syntax error)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    raw = path.read_bytes()
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not valid UTF-8 at byte offset {e.start}; re-save the file as UTF-8") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: invalid YAML: {getattr(e, 'problem', e)}") from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid YAML: nested too deeply") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    check_expanded_size(data, str(path))
    try:
        return OmegaConf.create(data)
    except OmegaConfBaseException as e:
        raise ConfigError(f"{path}: {str(e).splitlines()[0]}") from None
    except RecursionError:  # an alias that contains itself (a: &x [*x])
        raise ConfigError(f"{path}: a YAML alias refers to itself (or nesting is too deep)") from None


def yaml_sources(path: str | Path, _seen: tuple[Path, ...] = ()) -> list[tuple[str, DictConfig]]:
    """``path`` preceded by the presets its ``defaults:`` list names (recursively, in order)."""
    path = Path(path)
    if path.resolve() in _seen:
        raise ConfigError(f"{path}: defaults form a cycle ({' -> '.join(str(p) for p in (*_seen, path))})")
    node = load_yaml(path)
    try:
        presets = node.pop("defaults", None) if "defaults" in node else []
    except OmegaConfBaseException as e:  # e.g. an interpolation that resolves to nothing
        raise ConfigError(f"{path}: key 'defaults': {str(e).splitlines()[0]}") from None
    if isinstance(presets, str):
        presets = [presets]
    if not OmegaConf.is_list(presets) and not isinstance(presets, list):
        raise ConfigError(f"{path}: key 'defaults' must be a list of YAML paths relative to the file")
    out: list[tuple[str, DictConfig]] = []
    for preset in presets:
        if not isinstance(preset, str) or not preset.strip() or "\x00" in preset:
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
            no_interpolation(f, where)  # saved data: never resolved (module docstring)
            try:
                sources.append((where, OmegaConf.create(dict(f))))
            except OmegaConfBaseException as e:
                raise ConfigError(f"{where}: {str(e).splitlines()[0]}") from None
        else:
            sources += yaml_sources(f)
    dotlist = parse_overrides(overrides)
    for item in dotlist:
        try:
            sources.append((f"override {item!r}", OmegaConf.from_dotlist([item])))
        except (OmegaConfBaseException, yaml.YAMLError, RecursionError) as e:  # the value is parsed as YAML
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConfigError(f"override {item!r}: {msg}") from None

    base = OmegaConf.structured(schema)
    chosen: dict[str, type] = {}  # open slot -> the class its name picked
    for section, (default, make) in POLYMORPHIC.items():
        if section not in base or base.get(section) is not None:  # only the open slots of run schemas
            continue
        name = default
        for src_name, src in sources:  # the last source that names the section's kind wins
            try:
                node = src.get(section)
                if isinstance(node, DictConfig) and node.get("name") is not None:
                    name = node.get("name")
            except OmegaConfBaseException as e:  # e.g. retriever: ${missing}
                raise ConfigError(f"{src_name}: key '{section}': {str(e).splitlines()[0]}") from None
        try:
            slot = make(str(name))
        except ConfigError as e:
            raise ConfigError(f"{section}.name: {e}") from None
        chosen[section] = type(slot)
        base[section] = OmegaConf.structured(slot)
    root = schema if isinstance(schema, type) else type(schema)
    sources = _renamed_sources(root, sources, chosen)
    OmegaConf.set_struct(base, True)
    for key in OPEN_SECTIONS:  # free-form dicts: their keys belong to the adapter, checked there
        node = OmegaConf.select(base, key)
        if node is not None:
            OmegaConf.set_struct(node, False)
    for src_name, src in sources:
        try:
            base = OmegaConf.merge(base, src)
        except (OmegaConfBaseException, TypeError) as e:  # TypeError: a list merged onto a mapping
            key = getattr(e, "full_key", None) or "?"
            raise ConfigError(f"{src_name}: key '{key}': {_explain(e, key, base, src, src_name)}") from None
        _open_inline_retrievers(base, chosen)
    try:
        cfg = OmegaConf.to_object(base)
    except OmegaConfBaseException as e:
        raise ConfigError(f"key '{getattr(e, 'full_key', '?')}': {str(e).splitlines()[0]}") from None
    for bad in invalid_values(cfg):
        raise ConfigError(f"{_source_of(bad.key, sources)}{bad}") from None
    return cfg


def _open_inline_retrievers(base: DictConfig, chosen: Mapping[str, type]) -> None:
    """Let a later source add keys to an inline retriever dict an earlier one wrote (``retriever.dense:
    {name: dense, ...}`` in a preset, ``retriever.dense.query_split=clauses`` on the command line): the
    dict's keys are checked by its own class when the retriever is built (``Retriever.parse_config``)."""
    for section, cls in chosen.items():
        for slot in getattr(cls, "retriever_slots", ()):
            node = OmegaConf.select(base, f"{section}.{slot}", default=None, throw_on_missing=False)
            if isinstance(node, DictConfig):
                OmegaConf.set_struct(node, False)


def _explain(e: Exception, key: str, base: DictConfig, src: DictConfig, src_name: str) -> str:
    """OmegaConf's message for a value of the wrong shape, in the user's terms: what the key takes (its
    current value as the example) and what it got; other messages as OmegaConf words them."""
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    shape = next((s for s in ("list", "mapping") if f"is not a {'ListConfig' if s == 'list' else 'DictConfig'}" in msg
                  or (s == "mapping" and ("Cannot merge" in msg or "to Dict[" in msg))), None)
    if shape is None or key == "?":
        return msg
    got = OmegaConf.select(src, key, default=None, throw_on_missing=False)
    example = OmegaConf.select(base, key, default=None, throw_on_missing=False)
    if isinstance(example, (DictConfig, ListConfig)):
        example = OmegaConf.to_container(example)
    if shape == "list":
        sample = example if isinstance(example, list) and example else [1, 5, 10]
        flat = "[" + ",".join(map(str, sample)) + "]"
        how = f"; on the command line: {key}={flat}" if src_name.startswith("override") else ""
        return f"expects a list such as {sample}, got {got!r}{how}"
    return f"expects a mapping (key: value, ...), got {got!r}"


def _source_of(key: str, sources: Sequence[tuple[str, DictConfig]]) -> str:
    """``"<file or override>: "`` for the last source that sets ``key`` ("" when it is a default)."""
    for name, src in reversed(sources):
        try:
            if OmegaConf.select(src, key, default=_UNSET, throw_on_missing=False) is not _UNSET:
                return f"{name}: "
        except OmegaConfBaseException:
            continue
    return ""


_UNSET = object()


def from_dict(schema: Any, values: Mapping[str, Any], where: str = "saved config") -> Any:
    """A typed config from a plain dict (a checkpoint's hyperparameters, a saved retriever's
    retriever.json), validated by ``schema`` exactly like a YAML file."""
    return load_config(schema, [values], where=where)


def config_from_dict(values: Mapping[str, Any]) -> TrainConfig:
    """The TrainConfig a checkpoint carries (``hyper_parameters.config``)."""
    return from_dict(TrainConfig, values, "checkpoint config")


def to_yaml(cfg: Any) -> str:
    """The config as YAML that reads back to the same values (a literal ``${`` stays a literal)."""
    return OmegaConf.to_yaml(OmegaConf.create(to_saved(cfg)))


def to_saved(cfg: Any) -> dict:
    r"""``to_dict(cfg)`` in the form toolgraph saves configs (checkpoints, retriever.json): every literal
    ``${`` escaped (``escape_literals``), so that ``from_dict`` reads back the same values and never
    resolves one, nor refuses a literal the user wrote (``run_name='\${x}'``)."""
    return escape_literals(to_dict(cfg))


def to_dict(cfg: Any) -> dict:
    """Plain data, as saved in checkpoints and retriever.json. Never resolves ``${...}``: a config
    loaded by ``load_config`` holds resolved values already, and a literal must stay a literal."""
    return _plain(cfg)


def _plain(value: Any) -> Any:
    """Dataclasses, mappings and sequences as dicts and lists, without OmegaConf: its grammar would
    read a literal ``${a b}`` as a broken interpolation."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=False)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
