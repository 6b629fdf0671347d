"""BEIR-format reader (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) and ToolLens (COLT, CIKM'24).

ToolLens keeps ToolBench's API documents as one string per corpus line; we parse it back into
fields (category, RapidAPI tool = agent, API name, description, parameters, return schema) so
``render_tool(style="toolbench")`` reproduces corpus.jsonl byte for byte.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from toolgraph.data.formats import iter_jsonl, read_tsv
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
    try:
        return category, tool, api, desc, {"required": json.loads(req), "optional": json.loads(opt)}, json.loads(ret)
    except json.JSONDecodeError as e:
        raise DataError(f"unparsable parameter JSON: {e.msg}", path, lineno) from None


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


def read_beir(folder: Path, name: str, splits: dict[str, str], parse_toolbench: bool = False,
              val_fraction: float = 0.0, seed: int = 0) -> ToolDataset:
    """Read a BEIR folder. ``splits`` maps our split name -> qrels file relative to ``folder``."""
    folder = Path(folder)
    corpus_path = folder / "corpus.jsonl"
    tools: list[Tool] = []
    agents: dict[str, Agent] = {}
    for lineno, obj in iter_jsonl(corpus_path):
        if not isinstance(obj, dict) or "_id" not in obj or "text" not in obj:
            raise DataError("corpus line needs '_id' and 'text'", corpus_path, lineno)
        tid, text = str(obj["_id"]), obj["text"]
        if not text.strip():
            raise DataError(f"empty text for corpus id {tid!r}", corpus_path, lineno)
        if parse_toolbench:
            category, agent, api, desc, params, returns = parse_toolbench_doc(text, corpus_path, lineno)
            agents.setdefault(agent, Agent(agent, agent, f"RapidAPI tool in category {category}"))
            tools.append(Tool(tid, api, desc, agent=agent, category=category, parameters=params, returns=returns))
        else:
            tools.append(Tool(tid, obj.get("title") or tid, text))

    texts: dict[str, str] = {}
    queries_path = folder / "queries.jsonl"
    for lineno, obj in iter_jsonl(queries_path):
        if not isinstance(obj, dict) or "_id" not in obj or "text" not in obj:
            raise DataError("query line needs '_id' and 'text'", queries_path, lineno)
        texts[str(obj["_id"])] = obj["text"]

    known = {t.id for t in tools}
    skipped: Counter = Counter()
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
              seed: int = 0, toolbench_docs: bool = False) -> ToolDataset:
    """Any BEIR folder (``path`` absolute or relative to the data root)."""
    folder = Path(path) if Path(path).is_absolute() else root / path
    if splits is None:
        splits = {s: f"qrels/{s}.tsv" for s in ("train", "val", "test") if (folder / "qrels" / f"{s}.tsv").exists()}
        if (folder / "qrels" / "dev.tsv").exists() and "val" not in splits:
            splits["val"] = "qrels/dev.tsv"
    if not splits:
        raise DataError("no qrels/{train,dev,val,test}.tsv found", folder)
    return read_beir(folder, folder.name, splits, toolbench_docs, val_fraction, seed)


@DATASETS.register("toollens")
def load_toollens(root: Path, val_fraction: float = 0.1, seed: int = 0) -> ToolDataset:
    """ToolLens: 464 ToolBench APIs, 18,770 multi-tool queries; qrels train/test (tune == test,
    so val is carved from train)."""
    folder = root / "toollens" / "datasets" / "ToolLens"
    return read_beir(folder, "toollens", {"train": "qrels/train.tsv", "test": "qrels/test.tsv"},
                     parse_toolbench=True, val_fraction=val_fraction, seed=seed)
