"""Readers for the API-Bank files (Li et al., EMNLP 2023): the API spec catalog and the dialogues.

See ``api_bank.py`` for the choices (spec precedence, one query per dialogue); this module holds the
file-level code: the JSON-array test and training files, and the Chinese-headed ``all_apis.csv``.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolgraph.data.formats import read_json, require_fields, utf8_errors
from toolgraph.data.sources.api_bank_parse import csv_api_info, parse_call, py_literal, split_request, turns, user_text
from toolgraph.errors import DataError

META_TOOL = "ToolSearcher"  # the retrieval step itself: never a catalog tool or a gold label
_FIELDS = ("description", "input_parameters", "output_parameters")
_CSV_COLUMNS = ("应用场景", "类名", "api_info")  # scenario, class (= API) name, spec block


@dataclass
class Dialogue:
    qid: str
    split: str
    users: list[str]
    steps: list[str | None]  # API name of each labelled step (None: unparsable)
    calls: list[tuple[str, dict[str, str], str | None]] = field(default_factory=list)  # name, args, result


class Catalog:
    """API name -> kept spec. The first spec seen wins unless a later one has more of ``_FIELDS``;
    every distinct definition of a name is remembered to count conflicts."""

    def __init__(self) -> None:
        self.specs: dict[str, dict[str, Any]] = {}
        self.origin: dict[str, str] = {}
        self.versions: dict[str, set[str]] = {}
        self.occurrences = 0

    def add(self, spec: Any, origin: str, skipped: Counter) -> None:
        if isinstance(spec, list):
            for s in spec:
                self.add(s, origin, skipped)
            return
        name = spec.get("name") if isinstance(spec, dict) else None
        if not isinstance(name, str) or not name.strip() or not isinstance(spec.get("description"), str):
            skipped["API spec without a name or a string description (not harvested)"] += 1
            return
        name = name.strip()
        if name == META_TOOL:
            return
        self.occurrences += 1
        self.versions.setdefault(name, set()).add(json.dumps(spec, sort_keys=True, default=str))
        rich = sum(k in spec for k in _FIELDS)
        if name not in self.specs or rich > sum(k in self.specs[name] for k in _FIELDS):
            self.specs[name], self.origin[name] = spec, origin

    def add_results(self, calls: list[tuple[str, dict[str, str], str | None]], origin: str, skipped: Counter) -> None:
        """Harvest the specs ToolSearcher returned in a dialogue."""
        for name, _, result in calls:
            if name == META_TOOL and result is not None:
                try:
                    self.add(py_literal(result), origin, skipped)
                except ValueError:
                    skipped["unparsable ToolSearcher result (its spec not harvested)"] += 1

    def params(self, name: str, key: str) -> set[str]:
        p = self.specs.get(name, {}).get(key)
        return set(p) if isinstance(p, dict) else set()


def _records(path: Path) -> list[Any]:
    data = read_json(path)
    if not isinstance(data, list):
        raise DataError(f"expected a JSON array, got {type(data).__name__}", path)
    return data


def _step(output: str) -> str | None:
    call = parse_call(output.strip().removeprefix("API-Request:"))
    return call[0] if call else None


def _calls(dialogue: list[tuple[str, str]]) -> list[tuple[str, dict[str, str], str | None]]:
    out = []
    for role, text in dialogue:
        if role == "API-Request":
            req, result = split_request(text)
            call = parse_call(req)
            if call:
                out.append((*call, result))
    return out


def _dialogue(qid: str, split: str, context: str, outputs: list[str]) -> Dialogue:
    """Dialogue from its last step's input and the outputs of all its steps."""
    dialogue = turns(context)
    users = [user_text(t) for r, t in dialogue if r == "User" and user_text(t)]
    calls = _calls(dialogue)
    last = parse_call(outputs[-1].strip().removeprefix("API-Request:"))
    if last:
        calls.append((*last, None))
    return Dialogue(qid, split, users, [_step(o) for o in outputs], calls)


def read_test_level(path: Path, level: int, cat: Catalog, skipped: Counter) -> list[Dialogue]:
    """level-1/2-api.json: records of one dialogue share ``file``; ``id`` orders them."""
    groups: dict[str, list[dict]] = {}
    for i, rec in enumerate(_records(path)):
        require_fields(rec, {"file": str, "id": int, "instruction": str, "input": str, "expected_output": str},
                       path, None, f"record {i}")
        for k, line in enumerate(rec["instruction"].partition("API descriptions:")[2].strip().split("\n")):
            if line.strip():
                try:
                    spec = json.loads(line)
                except (ValueError, RecursionError) as e:  # JSONDecodeError, or a value json cannot hold
                    raise DataError(f"record {i}: API description line {k + 1} is not JSON: "
                                    f"{getattr(e, 'msg', None) or e or 'nested too deeply'}", path) from None
                cat.add(spec, f"level-{level} prompt", skipped)
        groups.setdefault(rec["file"], []).append(rec)
    out = []
    for file, recs in groups.items():
        recs.sort(key=lambda r: r["id"])
        d = _dialogue(f"l{level}-{file.removesuffix('.jsonl')}", "test", recs[-1]["input"],
                      [r["expected_output"] for r in recs])
        cat.add_results(d.calls, f"level-{level} ToolSearcher", skipped)
        out.append(d)
    return out


def read_level3(path: Path, cat: Catalog, skipped: Counter) -> list[Dialogue]:
    out = []
    for i, rec in enumerate(_records(path)):
        require_fields(rec, {"requirement": str, "apis": list}, path, None, f"record {i}")
        calls = []
        for k, api in enumerate(rec["apis"]):
            require_fields(api, {"api_name": str, "input": dict, "output": dict}, path, None, f"record {i} api {k}")
            result = api["output"].get("output")
            if api["api_name"] == META_TOOL:
                cat.add(result, "level-3 ToolSearcher", skipped)
            args = {p: v if isinstance(v, str) else json.dumps(v) for p, v in api["input"].items()}
            calls.append((api["api_name"], args, json.dumps(result, default=str)))
        users = [rec["requirement"].strip()] if rec["requirement"].strip() else []
        out.append(Dialogue(f"l3-{i}", "test", users, [c[0] for c in calls], calls))
    return out


def read_train(path: Path, cat: Catalog, skipped: Counter) -> list[Dialogue]:
    """lv3-api-train.json, steps in file order. A step continues the current dialogue when its context
    (input before ``Generate API Request``) extends the previous step's and holds an earlier call."""
    records = _records(path)
    chains: list[list[int]] = []
    contexts: list[str] = []
    for i, rec in enumerate(records):
        require_fields(rec, {"input": str, "output": str}, path, None, f"record {i}")
        context = rec["input"].rpartition("Generate API Request")[0] or rec["input"]
        if chains and context.startswith(contexts[-1]) and "\nAPI-Request:" in context:
            chains[-1].append(i)
        else:
            chains.append([i])
        contexts.append(context)
    out = []
    for chain in chains:
        d = _dialogue(f"lv3-{chain[0]}", "train", contexts[chain[-1]], [records[j]["output"] for j in chain])
        cat.add_results(d.calls, "lv3 train ToolSearcher", skipped)
        out.append(d)
    return out


def harvest_responses(path: Path, cat: Catalog, skipped: Counter) -> None:
    """lv3-response-train.json repeats the api file's dialogues up to their last result; 11 APIs are
    returned by ToolSearcher only there (dialogues that end with a search), so harvest its specs."""
    for i, rec in enumerate(_records(path)):
        require_fields(rec, {"input": str}, path, None, f"record {i}")
        cat.add_results(_calls(turns(rec["input"])), "lv3 train ToolSearcher", skipped)


def read_csv(path: Path, cat: Catalog, skipped: Counter) -> dict[str, str]:
    """all_apis.csv (Chinese headers); returns API name -> scenario (应用场景)."""
    if not path.is_file():
        raise DataError("file not found", path)
    scenario: dict[str, str] = {}
    with utf8_errors(path), path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in _CSV_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise DataError(f"missing column(s) {missing}", path, 1)
        try:
            for row in reader:
                try:
                    info = csv_api_info(row["api_info"] or "")
                except ValueError:
                    skipped["all_apis.csv row with unparsable api_info"] += 1
                    continue
                name = (row["类名"] or "").strip()
                cat.add({**info, "name": name}, "all_apis.csv", skipped)
                scenario[name] = row["应用场景"] or ""
        except csv.Error as e:
            raise DataError(f"malformed CSV: {e}", path, reader.line_num) from None
    return scenario
