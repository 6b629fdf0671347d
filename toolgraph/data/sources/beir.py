"""BEIR-format reader (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) and ToolLens (COLT, CIKM'24).

ToolLens keeps ToolBench's API documents as one string per corpus line; we parse it back into
fields (category, RapidAPI tool = agent, API name, description, parameters, return schema) so
``render_tool(style="toolbench")`` reproduces corpus.jsonl byte for byte.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from toolgraph.data.formats import Duplicates, iter_jsonl, parse_json, read_tsv
from toolgraph.data.schema import Agent, Query, Tool, ToolDataset
from toolgraph.data.splits import carve_val
from toolgraph.errors import DataError
from toolgraph.registry import DATASETS

_TOOLBENCH_DOC = re.compile(
    r"^category_name:(.*?), tool_name:(.*?), api_name:(.*?), api_description:(.*?), "
    r"required_params: (.*), optional_params: (.*), return_schema: (.*)$",
    re.S,
)


def parse_toolbench_doc(text: str, path: Path, lineno: int) -> tuple[str, str, str, str, dict, object]:
    """ToolBench's API document string -> (category, tool, api, description, parameters, returns)."""
    m = _TOOLBENCH_DOC.match(text)
    if not m:
        raise DataError("not a ToolBench API document", path, lineno)
    category, tool, api, desc, req, opt, ret = m.groups()
    params = {"required": parse_json(req, path, lineno), "optional": parse_json(opt, path, lineno)}
    return category, tool, api, desc, params, parse_json(ret, path, lineno)


def read_qrels(path: Path) -> dict[str, list[str]]:
    """query id -> relevant corpus ids (score > 0), in file order."""
    out: dict[str, list[str]] = {}
    for lineno, row in read_tsv(path):
        if len(row) < 3:
            raise DataError(f"expected 3 tab-separated columns (query-id, corpus-id, score), got {len(row)}", path, lineno)
        try:
            score = float(row[2])
        except ValueError:
            raise DataError(f"score {row[2]!r} is not a number", path, lineno) from None
        if score > 0 and row[1] not in out.setdefault(row[0], []):
            out[row[0]].append(row[1])
    return out


def _id_and_text(obj: object, path: Path, lineno: int, what: str) -> tuple[str, str]:
    """A corpus or query line's ``_id`` (a string or a number) and its ``text`` (a string)."""
    if not isinstance(obj, dict) or "_id" not in obj or "text" not in obj:
        raise DataError(f"{what} line needs '_id' and 'text'", path, lineno)
    ident, text = obj["_id"], obj["text"]
    if isinstance(ident, bool) or not isinstance(ident, (str, int)) or not str(ident).strip():
        raise DataError(f"'_id' must be a non-empty string or an integer, got {ident!r:.60}", path, lineno)
    if not isinstance(text, str):
        raise DataError(f"'text' must be a string, got {type(text).__name__}", path, lineno)
    return str(ident), text


def read_beir(folder: Path, name: str, splits: dict[str, str], parse_toolbench: bool = False,
              val_fraction: float = 0.0, seed: int = 0, on_duplicate: str = "error") -> ToolDataset:
    """Read a BEIR folder. ``splits`` maps our split name -> qrels file relative to ``folder``.
    ``on_duplicate``: a query ``_id`` repeated in queries.jsonl is an ``error`` (default), or
    ``keep-first`` / ``keep-last`` (counted in ``skipped``)."""
    folder = Path(folder)
    skipped: Counter = Counter()
    repeats = Duplicates("query _id", on_duplicate, skipped)  # the option is checked before any file is read
    corpus_path = folder / "corpus.jsonl"
    tools: list[Tool] = []
    agents: dict[str, Agent] = {}
    tool_line: dict[str, int] = {}
    for lineno, obj in iter_jsonl(corpus_path):
        tid, text = _id_and_text(obj, corpus_path, lineno, "corpus")
        if not text.strip():
            raise DataError(f"empty text for corpus id {tid!r}", corpus_path, lineno)
        if tid in tool_line:
            raise DataError(f"duplicate corpus id {tid!r} (first on line {tool_line[tid]})", corpus_path, lineno)
        tool_line[tid] = lineno
        if obj.get("title") is not None and not isinstance(obj["title"], str):
            raise DataError(f"'title' must be a string, got {type(obj['title']).__name__}", corpus_path, lineno)
        if parse_toolbench:
            category, agent, api, desc, params, returns = parse_toolbench_doc(text, corpus_path, lineno)
            agents.setdefault(agent, Agent(agent, agent, f"RapidAPI tool in category {category}"))
            tools.append(Tool(tid, api, desc, agent=agent, category=category, parameters=params, returns=returns))
        else:
            tools.append(Tool(tid, obj.get("title") or tid, text))

    texts: dict[str, str] = {}
    queries_path = folder / "queries.jsonl"
    for lineno, obj in iter_jsonl(queries_path):
        qid, text = _id_and_text(obj, queries_path, lineno, "query")
        if repeats.add(qid, queries_path, lineno) != "skip":  # a repeat is an error unless on_duplicate says
            texts[qid] = text

    known = {t.id for t in tools}
    queries: list[Query] = []
    used: set[str] = set()
    for split, rel in splits.items():
        qrels_path = folder / rel
        for qid, tids in read_qrels(qrels_path).items():
            if qid not in texts:
                raise DataError(f"qrels name query {qid!r} that queries.jsonl lacks", qrels_path)
            if qid in used:
                raise DataError(f"query {qid!r} appears in more than one split", qrels_path)
            bad = [t for t in tids if t not in known]
            if bad:
                raise DataError(f"query {qid!r} names unknown corpus id(s) {bad}", qrels_path)
            used.add(qid)
            queries.append(Query(qid, texts[qid], tuple(tids), split))
    skipped["query without qrels in the read splits"] += len(texts) - len(used)
    skipped = +skipped  # drop zero counts
    queries = carve_val(queries, val_fraction, seed)
    return ToolDataset(name, tools, queries, list(agents.values()), [], skipped,
                       {"folder": str(folder), "val_fraction": val_fraction, "seed": seed})


@DATASETS.register("beir")
def load_beir(root: Path, path: str, splits: dict[str, str] | None = None, val_fraction: float = 0.0,
              seed: int = 0, toolbench_docs: bool = False, on_duplicate: str = "error") -> ToolDataset:
    """Any BEIR folder (``path`` absolute or relative to the data root)."""
    folder = Path(path) if Path(path).is_absolute() else root / path
    if splits is None:
        splits = {s: f"qrels/{s}.tsv" for s in ("train", "val", "test") if (folder / "qrels" / f"{s}.tsv").exists()}
        if (folder / "qrels" / "dev.tsv").exists() and "val" not in splits:
            splits["val"] = "qrels/dev.tsv"
    if not splits:
        raise DataError("no qrels/{train,dev,val,test}.tsv found", folder)
    return read_beir(folder, folder.name, splits, toolbench_docs, val_fraction, seed, on_duplicate)


@DATASETS.register("toollens")
def load_toollens(root: Path, val_fraction: float = 0.1, seed: int = 0) -> ToolDataset:
    """ToolLens: 464 ToolBench APIs, 18,770 multi-tool queries; qrels train/test (tune == test,
    so val is carved from train)."""
    folder = root / "toollens" / "datasets" / "ToolLens"
    return read_beir(folder, "toollens", {"train": "qrels/train.tsv", "test": "qrels/test.tsv"},
                     parse_toolbench=True, val_fraction=val_fraction, seed=seed)
