"""A run's files: its folder, results.json, config, checkpoints; and the signals that stop it.

Low in the layers (errors, files), so that training, evaluation, the CLI and the benchmarks share
one reading of each:

* output folders: ``check_output_folder`` (never write into a folder toolgraph did not make),
  ``replace_folder`` (an export swapped in whole), ``retire_results`` / ``write_results`` /
  ``read_results`` (``results.json`` is removed when a run starts writing and written last: it marks
  a complete run), ``disk_full_is_an_error``;
* ``read_checkpoint``: THE reader of a toolgraph checkpoint (``torch.load(weights_only=True)`` and
  the checks of its sections), used by ``toolgraph.load``, ``resume`` and the CLI;
  ``resolve_checkpoint`` (a run folder -> its best checkpoint) and ``run_config`` (the config a
  checkpoint or run folder was trained with);
* signals: SIGTERM / SIGINT unwind like an error (temp files removed) and the command exits 143 /
  130 (``install_signal_handlers``, ``sigterm_deferred`` around Lightning's loops).
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from toolgraph.errors import ConfigError, DataError, no_space_is_a_data_error
from toolgraph.files import clean_new_copies, clean_old_copies, recover_folder, swap_folder, write_text_atomic

__all__ = ["OUTPUT_MARKERS", "RESULTS", "Checkpoint", "Terminated", "check_output_folder", "disk_full_is_an_error",
           "install_signal_handlers", "read_checkpoint", "read_results", "received_signal", "replace_folder",
           "resolve_checkpoint", "retire_results", "run_config", "sigterm_deferred", "write_results",
           "write_text_atomic"]

RESULTS = "results.json"
OUTPUT_MARKERS = ("config.yaml", RESULTS, "retriever.json")  # a folder holding one of these is ours


_TEMP = re.compile(r"\.(config\.yaml|results\.json|rankings\.jsonl|curves\.png)\.tmp-\d+")


def retire_results(out: str | Path) -> None:
    """Remove ``out/results.json`` before a run writes anything else there, so an interrupted re-run
    never leaves the previous results beside the new config or rankings; temp files that a killed run
    (kill -9) left behind go too."""
    out = Path(out)
    (out / RESULTS).unlink(missing_ok=True)
    for stale in out.glob(".*.tmp-*"):
        if _TEMP.fullmatch(stale.name) and stale.is_file():
            stale.unlink(missing_ok=True)


def write_results(out: str | Path, results: dict[str, Any]) -> Path:
    """``out/results.json``, atomically; call it last (it marks the run complete)."""
    return write_text_atomic(Path(out) / RESULTS, json.dumps(results, indent=2, default=str) + "\n")


def read_results(path: str | Path) -> dict[str, Any]:
    """A results.json (or the folder holding it); a missing, cut or malformed file is a DataError that
    names it and says to re-run."""
    path = Path(path)
    if path.is_dir() or not path.name.endswith(".json"):
        path = path / RESULTS
    if not path.is_file():
        raise DataError("not found: the run did not finish (or was interrupted); re-run it to write it", path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise DataError(f"not a readable results file ({type(e).__name__}: {str(e)[:120]}); it was cut or "
                        "edited: re-run the evaluation (or training) that wrote it", path) from None
    if not isinstance(data, dict) or not isinstance(data.get("metrics", {}), dict):
        raise DataError("not a toolgraph results file (expected a JSON object with 'metrics'); re-run the "
                        "evaluation that wrote it", path)
    return data


def disk_full_is_an_error(out: str | Path) -> Any:
    """A full disk (or quota) while writing ``out``: a DataError naming the folder, not a traceback.
    What is left is what an interrupted run leaves (temp files removed, no results.json, a swapped
    folder as it was), so the message says that and to re-run."""
    return no_space_is_a_data_error(out, "the results", "nothing was half-written (every file there is a whole "
                                    "one), but the folder has no results.json: this run is not saved. Free some "
                                    "space and re-run")


def check_output_folder(path: str | Path, what: str, markers: tuple[str, ...] = OUTPUT_MARKERS) -> Path:
    """``path`` if toolgraph may write there: absent, an empty folder, or a folder holding one of
    ``markers`` (one of our outputs). Anything else (a file, someone else's folder) is refused with a
    ConfigError naming ``what``; nothing is deleted or overwritten."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return path
    if not path.is_dir():
        raise ConfigError(f"{what}: {str(path)!r} exists and is not a folder; give a new or empty folder "
                          "(nothing was written)")
    if any((path / m).exists() for m in markers) or next(path.iterdir(), None) is None:
        return path
    raise ConfigError(f"{what}: {str(path)!r} is a folder that toolgraph did not write (it holds none of "
                      f"{', '.join(markers)}); refusing to write into it. Give a new or empty folder, or a "
                      "previous output folder (nothing was written)")


def replace_folder(dest: str | Path, build: Callable[[Path], Any], what: str = "output") -> Any:
    """``build(tmp)`` swapped in at ``dest`` (``files.swap_folder``): an interrupted export leaves the old
    folder, never a mix. ``dest`` must be absent, empty, or a saved retriever (retriever.json)."""
    dest = Path(dest)
    recover_folder(dest)  # what a killed (kill -9) export left: the old folder back (a rename) ...
    clean_old_copies(dest)  # ... or, killed after its swap, the old copy: deleted by this writer, not a reader
    clean_new_copies(dest)
    check_output_folder(dest, what, ("retriever.json", "manifest.json"))
    return swap_folder(dest, build)


class Terminated(BaseException):  # noqa: N818 - like KeyboardInterrupt: not an Exception, nothing swallows it
    """SIGTERM received: unwinds the stack (temp files removed); the command exits 143."""


_SIGNALS: dict[str, Any] = {"received": [], "defer": 0}


def _on_signal(signum: int, frame: Any) -> None:
    _SIGNALS["received"].append(signum)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    if not _SIGNALS["defer"]:
        raise Terminated


def install_signal_handlers() -> dict:
    """SIGTERM raises ``Terminated`` and SIGINT ``KeyboardInterrupt`` (main thread only), and both are
    remembered so the command can exit 128 + signal even when a library turned them into SystemExit.
    Returns the handlers it replaced, for :func:`restore_signal_handlers` ({} off the main thread)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    _SIGNALS["received"].clear()
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    return previous


def restore_signal_handlers(previous: dict) -> None:
    """Put back the handlers ``install_signal_handlers`` replaced (a command run from Python, e.g.
    ``toolgraph.cli.main`` in a test or a notebook, leaves the caller's handlers as they were)."""
    for signum, handler in previous.items():
        if handler is not None:  # None: a handler not installed from Python, which cannot be put back
            signal.signal(signum, handler)


def received_signal() -> int | None:
    """The first SIGTERM / SIGINT received since ``install_signal_handlers`` (None: none)."""
    return _SIGNALS["received"][0] if _SIGNALS["received"] else None


@contextmanager
def sigterm_deferred() -> Iterator[None]:
    """Inside Lightning's fit / test: a SIGTERM is only recorded (Lightning's own handler stops the loop at
    the end of the batch); after the block, a recorded SIGTERM raises ``Terminated``."""
    _SIGNALS["defer"] += 1
    try:
        yield
    finally:
        _SIGNALS["defer"] -= 1
    if signal.SIGTERM in _SIGNALS["received"]:
        raise Terminated


# ---- checkpoints: one reader ----------------------------------------------------------------------
@dataclass
class Checkpoint:
    """A toolgraph checkpoint as read by ``read_checkpoint``: the task's registry name, the run's saved
    config (plain data: ``Task.from_checkpoint`` is where it becomes a typed config again), the
    artifacts that rebuild the modules without a download, the weights, and the whole file's dict."""

    path: Path
    task: str
    config: dict[str, Any]
    artifacts: dict[str, Any]
    state_dict: dict[str, Any]
    raw: dict[str, Any]


def read_checkpoint(path: str | Path) -> Checkpoint:
    """The toolgraph checkpoint at ``path``, read with ``torch.load(weights_only=True)`` (tensors and plain
    data only: a checkpoint holding pickled objects is refused, never unpickled). A missing, cut,
    foreign or incomplete file is a DataError naming it."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise DataError("checkpoint not found", path)
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - cut, foreign or pickled: one clear message
        raise DataError(f"cannot be read as a weights-only checkpoint ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:200] if str(e) else ''}); it may be cut short or not a toolgraph "
                        "checkpoint, and arbitrary pickled objects are never unpickled", path) from None
    meta = raw.get("toolgraph") if isinstance(raw, dict) else None
    if not isinstance(meta, dict) or "hyper_parameters" not in raw:
        raise DataError("not a toolgraph checkpoint (no 'toolgraph' section)", path)
    hparams = raw["hyper_parameters"]
    config = hparams.get("config") if isinstance(hparams, dict) else None
    if not isinstance(meta.get("task"), str) or not isinstance(meta.get("artifacts"), dict) \
            or not isinstance(config, dict) or not isinstance(raw.get("state_dict"), dict):
        raise DataError("incomplete toolgraph checkpoint (needs toolgraph.task, toolgraph.artifacts, "
                        "hyper_parameters.config and state_dict); it was cut short or not written by toolgraph",
                        path)
    return Checkpoint(path, meta["task"], config, meta["artifacts"], raw["state_dict"], raw)


def resolve_checkpoint(path: str | Path, where: str = "checkpoint") -> Path:
    """A .ckpt, or a run folder: its best checkpoint (results.json), else checkpoints/last.ckpt."""
    p = Path(path)
    if p.is_file():
        return p
    if (p / RESULTS).is_file():
        best = read_results(p / RESULTS).get("training", {}).get("best_checkpoint")
        if best and Path(best).is_file():
            return Path(best)
    last = p / "checkpoints" / "last.ckpt"
    if last.is_file():
        return last
    raise ConfigError(f"{where}: {str(path)!r} is neither a .ckpt nor a run folder with a checkpoint")


def run_config(path: str | Path) -> dict[str, Any] | None:
    """The config (plain data) a ``.ckpt`` or a run folder (its ``config.yaml``) was trained with; None when
    ``path`` is neither (e.g. an exported retriever folder)."""
    p = Path(path)
    if p.is_file() and p.suffix == ".ckpt":
        return read_checkpoint(p).config
    if (p / "config.yaml").is_file():
        try:
            values = yaml.safe_load((p / "config.yaml").read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise DataError(f"not a readable run config ({type(e).__name__}); re-run the training or give "
                            "--config", p / "config.yaml") from None
        return values if isinstance(values, dict) else None
    return None
