"""Dataclass schemas and a strict OmegaConf merge of YAML files and ``key=value`` overrides.

    cfg = load_config(EvaluateConfig, ["configs/eval/bm25_toollens.yaml"], ["eval.ks=[1,5]"])

* The dataclass is the schema: an unknown key or a value of the wrong type fails with the key's
  full name and the file (or ``override``) it came from.
* A section whose schema depends on its ``name`` (``retriever.name: dense``) gets the config class
  registered under that name, so each method validates its own keys.
* ``--key=value`` is accepted as well as ``key=value`` (W&B sweep agents pass either).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from toolgraph.errors import ConfigError


@dataclass
class DataConfig:
    name: str = "toollens"  # registry name, or a folder in the canonical JSONL format
    root: str | None = None  # default: $TOOLGRAPH_DATA
    split: str = "test"  # the split evaluated
    setting: str = "standard"  # standard | transductive | inductive-<pct> | noise-<pct>
    seed: int = 0  # for the setting's random choices
    options: dict[str, Any] = field(default_factory=dict)  # adapter options (val_fraction, ...)


@dataclass
class EvalConfig:
    ks: list[int] = field(default_factory=lambda: [1, 3, 5, 7, 10])
    metrics: list[str] = field(default_factory=lambda: ["recall", "precision", "ndcg", "map", "pass", "mrr"])
    depth: int = 100  # tools retrieved per query (the curves go up to here)
    batch_size: int = 256  # queries per retrieve() call
    agent_level: bool = True  # also score agents (a tool's owner) when the dataset has them
    max_queries: int | None = None  # evaluate the first N queries of the split (smoke runs)
    query_mode: str = "direct"  # direct | step-wise (each step retrieved, then merged)
    steps: str = "auto"  # step-wise: annotated (Query.steps) | sentences | auto (annotated, else sentences)
    step_merge: str = "max"  # max | interleave | rrf (retrieval/steps.py)


@dataclass
class EvaluateConfig:
    data: DataConfig = field(default_factory=DataConfig)
    retriever: Any = None  # schema chosen by retriever.name (see toolgraph.retrieval)
    eval: EvalConfig = field(default_factory=EvalConfig)
    out: str | None = None  # results folder


def _retriever_schema(name: str) -> Any:
    from toolgraph.retrieval import RETRIEVERS

    return RETRIEVERS.get(name).Config(name=name)


def _task_schema(name: str) -> Any:
    from toolgraph.registry import TASKS
    from toolgraph.tasks import bi_encoder  # noqa: F401  (register tasks)

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


def load_config(schema: type, files: Sequence[str | Path | dict] = (), overrides: Sequence[str] = ()) -> Any:
    """Merge ``files`` (YAML paths, or plain dicts) then ``overrides`` over ``schema``'s defaults;
    return the typed object."""
    sources: list[tuple[str, DictConfig]] = [
        ("saved config", OmegaConf.create(f)) if isinstance(f, dict) else (str(f), load_yaml(f)) for f in files]
    dotlist = parse_overrides(overrides)
    try:
        sources += [(f"override {item!r}", OmegaConf.from_dotlist([item])) for item in dotlist]
    except OmegaConfBaseException as e:
        raise ConfigError(f"overrides: {e}") from None

    base = OmegaConf.structured(schema)
    for section, (default, make) in POLYMORPHIC.items():
        if section not in base:
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
    for where, src in sources:
        try:
            base = OmegaConf.merge(base, src)
        except OmegaConfBaseException as e:
            key = getattr(e, "full_key", None) or "?"
            msg = str(e).splitlines()[0]
            raise ConfigError(f"{where}: key '{key}': {msg}") from None
    try:
        return OmegaConf.to_object(base)
    except OmegaConfBaseException as e:
        raise ConfigError(f"key '{getattr(e, 'full_key', '?')}': {str(e).splitlines()[0]}") from None


def to_yaml(cfg: Any) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: Any) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)  # type: ignore[return-value]
