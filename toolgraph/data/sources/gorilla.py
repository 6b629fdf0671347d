"""Gorilla APIBench (Patil et al., "Gorilla: Large Language Model Connected with Massive APIs",
NeurIPS 2024; github.com/ShishirPatil/gorilla, ``data/api`` and ``data/apibench``).

Catalogs ``data/api/{torchhub,huggingface,tensorflowhub}_api.jsonl`` (94 / 936 / 696 rows). Records
``data/apibench/*_{train,eval}.json`` (JSONL despite the name): ``code`` holds the prompt, ``api_data``
a copy of the catalog row it was generated from. Only TorchHub has a train file here, so
``gorilla-torchhub`` = train (val carved) + test, the other two are test-only.

A tool is *the model an API call loads*; catalog rows that load the same model are one tool (the
first row gives description, domain and arguments; later rows are counted in ``skipped``):
- TorchHub: the ``api_call`` string (unique in the catalog, it names repo and model).
- TensorFlow Hub: the tfhub.dev handle in the call (``google/universal-sentence-encoder/4``). The
  catalog repeats models with paraphrased descriptions (220 rows for that encoder alone, under
  api_names such as ``model_id``) and loads one handle via hub.load / hub.KerasLayer / Sequential;
  one row per call would make gold labels arbitrary among identical APIs. 696 rows -> 58 tools.
- Hugging Face: the model repo id: ``api_name`` when it has an owner (``facebook/bart-large-cnn``),
  else the ``owner/name`` the call loads, else the bare api_name (``bert-base-uncased``). The call
  alone is no identity (``joblib.load('model.joblib')`` serves 29 repos; ``pipeline('summarization')``
  omits the model).
The gold tool of a record is the key of its ``api_data``; failing that, the one tool whose rows carry
the record's ``api_name`` (one HF record: the catalog row's call is truncated); else it is skipped. Query text = the user's request: the text after the last ``###Instruction:`` (one
record carries an in-context example first) up to ``###Input``/``###Output`` (TorchHub train uses
``{'Instruction': ..., 'Output': ...}``). Agent = the publisher level the hub offers: the TorchHub
repo (``pytorch/vision``), the tfhub.dev publisher, the HF repo owner (none for un-owned models);
Gorilla's ``framework``/``api_provider`` is nearly constant per hub, so it is no owner level.
Category = ``domain``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from toolgraph.data.formats import iter_jsonl, require_fields
from toolgraph.data.schema import Agent, Query, Tool, ToolDataset
from toolgraph.data.sources._filter import QueryFilter, SkipReasons
from toolgraph.data.splits import carve_val
from toolgraph.errors import DataError
from toolgraph.registry import DATASETS

_INSTRUCTION = re.compile(r"#{3}\s*Instruction:\s*")
_END = re.compile(r"\s*#{3}\s*(?:Input|Output)\b")
_DICT_PROMPT = re.compile(r"^\s*\{'Instruction':\s*(.*?),\s*'(?:Input|Output)':", re.S)
_TORCH_REPO = re.compile(r"torch\.hub\.load\(\s*(?:repo_or_dir\s*=\s*)?['\"]([^'\"]+)['\"]")
_TFHUB = re.compile(r"https?://tfhub\.dev/([^'\"\s)]+)")
_HF_REPO = re.compile(r"(?<![\w.:/-])([A-Za-z0-9][\w.-]*/[\w.-]+)")
_REASONS = SkipReasons(empty_text="record with an empty instruction",
                       repeated_query="repeated instruction text (first kept, test file read first)")

# key function: catalog row / api_data -> (tool id, tool name, agent id or None)
KeyFn = Callable[[dict], tuple[str, str, str | None]]


def _torch_key(row: dict) -> tuple[str, str, str | None]:
    m = _TORCH_REPO.search(row["api_call"])
    return row["api_call"].strip(), row["api_name"], m.group(1).split(":")[0] if m else None


def _tf_key(row: dict) -> tuple[str, str, str | None]:
    m = _TFHUB.search(row["api_call"])
    if not m:
        return row["api_call"].strip(), row["api_name"], None
    handle = m.group(1).rstrip("/")
    return handle, handle, handle.split("/")[0]


def _hf_key(row: dict) -> tuple[str, str, str | None]:
    name = row["api_name"].strip()
    if "/" not in name:
        m = _HF_REPO.search(row["api_call"])
        name = m.group(1) if m else name
    return name, name, name.split("/")[0] if "/" in name else None


def instruction(code: str) -> str | None:
    """The user's request inside a Gorilla prompt, or None when no instruction marker is found."""
    m = _DICT_PROMPT.match(code)
    if m:
        return m.group(1).strip()
    starts = list(_INSTRUCTION.finditer(code))
    if not starts:
        return None
    rest = code[starts[-1].end():]
    end = _END.search(rest)
    return (rest[:end.start()] if end else rest).strip()


def _blank(value: object) -> bool:
    return value is None or (isinstance(value, str) and value.strip() in ("", "N/A")) or value in ([], {})


def _read_catalog(path: Path, key: KeyFn, hub: str, agent_kind: str, skipped: Counter
                  ) -> tuple[dict[str, Tool], dict[str, Agent], dict[str, set[str]]]:
    """Tools (one per model, first row kept), their agents, and raw api_name -> tool ids."""
    tools: dict[str, Tool] = {}
    agents: dict[str, Agent] = {}
    by_name: dict[str, set[str]] = {}  # raw api_name -> tool ids, for the fallback match
    for lineno, row in iter_jsonl(path):
        require_fields(row, {"api_call": str, "api_name": str, "description": str}, path, lineno)
        tid, tname, agent = key(row)
        if not tid or not tname.strip():
            raise DataError("empty api_call or api_name", path, lineno)
        by_name.setdefault(row["api_name"].strip(), set()).add(tid)
        if tid in tools:
            skipped["catalog row for a model already listed (merged into its first row)"] += 1
            continue
        if agent:
            agents.setdefault(agent, Agent(agent, agent, f"{hub} {agent_kind}"))
        params = row.get("api_arguments")
        tools[tid] = Tool(tid, tname, row["description"].strip(), agent=agent,
                          category=row.get("domain") or None, parameters=None if _blank(params) else params)
    return tools, agents, by_name


def read_apibench(root: Path, name: str, catalog: str, files: dict[str, str], key: KeyFn, hub: str,
                  agent_kind: str, val_fraction: float = 0.0, seed: int = 0) -> ToolDataset:
    folder = root / "gorilla-apibench" / "data"
    skipped: Counter = Counter()
    api_path = folder / "api" / catalog
    tools, agents, by_name = _read_catalog(api_path, key, hub, agent_kind, skipped)

    filt = QueryFilter(_REASONS, skipped)
    queries: list[Query] = []
    several = by_api_name = 0
    for split, fname in files.items():
        path = folder / "apibench" / fname
        for lineno, rec in iter_jsonl(path):
            require_fields(rec, {"code": str, "api_data": dict}, path, lineno)
            require_fields(rec["api_data"], {"api_call": str, "api_name": str}, path, lineno, what="api_data")
            text = instruction(rec["code"])
            if text is None:
                skipped["record without an instruction in 'code'"] += 1
                continue
            if filt.blank(text):
                continue
            gold = key(rec["api_data"])[0]
            if gold not in tools:
                named = by_name.get(rec["api_data"]["api_name"].strip(), set())
                if len(named) != 1:
                    skipped["record whose api_data names no catalog model"] += 1
                    continue
                gold, by_api_name = next(iter(named)), by_api_name + 1
            if filt.repeated(text):
                continue
            filt.keep(text)
            several += len(_INSTRUCTION.findall(rec["code"])) > 1
            queries.append(Query(f"{Path(fname).stem}:{lineno}", text, (gold,), split))
    queries = carve_val(queries, val_fraction, seed)
    notes = {"files": [str(api_path)] + [str(folder / "apibench" / f) for f in files.values()],
             "val_fraction": val_fraction, "seed": seed,
             "records_with_several_instructions_last_kept": several, "gold_matched_by_api_name_only": by_api_name}
    return ToolDataset(name, list(tools.values()), queries, list(agents.values()), [], +skipped, notes)


@DATASETS.register("gorilla-torchhub")
def load_gorilla_torchhub(root: Path, val_fraction: float = 0.1, seed: int = 0) -> ToolDataset:
    """94 TorchHub APIs; train = torchhub_train.json (val carved), test = torchhub_eval.json."""
    return read_apibench(root, "gorilla-torchhub", "torchhub_api.jsonl",
                         {"test": "torchhub_eval.json", "train": "torchhub_train.json"}, _torch_key,
                         "PyTorch Hub", "repository", val_fraction, seed)


@DATASETS.register("gorilla-huggingface")
def load_gorilla_huggingface(root: Path) -> ToolDataset:
    """Hugging Face models; test-only (huggingface_train.json is not in the snapshot)."""
    return read_apibench(root, "gorilla-huggingface", "huggingface_api.jsonl", {"test": "huggingface_eval.json"},
                         _hf_key, "Hugging Face Hub", "user or organisation")


@DATASETS.register("gorilla-tensorflow")
def load_gorilla_tensorflow(root: Path) -> ToolDataset:
    """TensorFlow Hub models; test-only (tensorflow_train.json is not in the snapshot)."""
    return read_apibench(root, "gorilla-tensorflow", "tensorflowhub_api.jsonl", {"test": "tensorflow_eval.json"},
                         _tf_key, "TensorFlow Hub", "publisher")
