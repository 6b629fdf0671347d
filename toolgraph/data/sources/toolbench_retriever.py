"""ToolBench's official retriever data (Qin et al., "ToolLLM", ICLR 2024; github.com/OpenBMB/ToolBench,
``data/retrieval/G1..G3`` from data.zip; the repo ships the format sample ``data/retriever/G1_demo``).

Files, as ToolBench's ``preprocess_retriever_data.py`` writes them with pandas (tab-separated,
double-quote quoting where a field holds a quote):

    corpus.tsv                 header ``docid  document_content``; the content is a JSON API doc
                               (category_name, tool_name, api_name, api_description, parameters, ...)
    {train,test}.query.txt     ``qid  text``, no header, ONE LINE PER RELEVANT API (a query repeats)
    qrels.{train,test}.tsv     ``qid  0  docid  relevance``, no header (TREC style)

Docs are parsed into fields with the same :class:`~toolgraph.data.sources.toolbench.Catalog` as the
ToolBench query files, so tool ids are ``"{tool_name}::{api_name}"`` here too (equal docs under
different docids merge; a differing doc of the same name gets ``~2``). corpus.tsv repeats docids
(the demo lists docs 1 and 2 twice, identically): such repeats are counted, a repeat with other
content is an error. Relevant docs keep the qrels' order. Train queries -> train (val carved from
them), test -> test.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from toolgraph.data.formats import read_tsv
from toolgraph.data.schema import Query, ToolDataset
from toolgraph.data.sources._filter import QueryFilter, SkipReasons
from toolgraph.data.sources.toolbench import Catalog
from toolgraph.data.splits import carve_val
from toolgraph.errors import DataError
from toolgraph.registry import DATASETS

_REASONS = SkipReasons(empty_text="query with empty text", no_tools="query with no relevant doc in corpus.tsv",
                       dropped_tool="qrels pair naming a docid not in corpus.tsv",
                       repeated_tool="repeated relevant API within a query")


def _read_corpus(path: Path, catalog: Catalog, skipped: Counter) -> dict[str, str]:
    """docid -> tool id."""
    docs: dict[str, tuple[str, str]] = {}  # docid -> (tool id, raw content)
    for lineno, row in read_tsv(path, header=True, quoted=True):
        if len(row) != 2:
            raise DataError(f"expected 2 tab-separated columns (docid, document_content), got {len(row)}", path, lineno)
        docid, content = row[0].strip(), row[1]
        if docid in docs:
            if docs[docid][1] != content:
                raise DataError(f"docid {docid!r} repeated with different content", path, lineno)
            skipped["repeated corpus line (same docid, same document)"] += 1
            continue
        try:
            doc = json.loads(content)
        except json.JSONDecodeError as e:
            raise DataError(f"docid {docid!r}: malformed JSON document: {e.msg} (column {e.colno})", path, lineno) from None
        except (ValueError, RecursionError) as e:  # a number json cannot convert, nesting too deep
            raise DataError(f"docid {docid!r}: unreadable JSON document: {e or 'nested too deeply'}", path, lineno) from None
        docs[docid] = (catalog.add_api(doc, f"docid {docid!r}", path, lineno), content)
    return {d: tid for d, (tid, _) in docs.items()}


def _read_qrels(path: Path) -> dict[str, list[str]]:
    """qid -> relevant docids (relevance > 0), in file order."""
    out: dict[str, list[str]] = {}
    for lineno, row in read_tsv(path, header=False):
        if len(row) != 4:
            raise DataError(f"expected 4 tab-separated columns (qid, 0, docid, relevance), got {len(row)}", path, lineno)
        try:
            rel = float(row[3])
        except ValueError:
            raise DataError(f"relevance {row[3]!r} is not a number", path, lineno) from None
        if rel > 0:
            out.setdefault(row[0].strip(), []).append(row[2].strip())
    return out


def _read_queries(path: Path, skipped: Counter) -> dict[str, str]:
    texts: dict[str, str] = {}
    for lineno, row in read_tsv(path, header=False, quoted=True):
        if len(row) != 2:
            raise DataError(f"expected 2 tab-separated columns (qid, text), got {len(row)}", path, lineno)
        qid, text = row[0].strip(), row[1]
        if qid in texts:
            if texts[qid] != text:
                raise DataError(f"query {qid!r} repeated with different text", path, lineno)
            skipped["repeated query line (one per relevant API)"] += 1
            continue
        texts[qid] = text
    return texts


@DATASETS.register("toolbench-retriever")
def load_toolbench_retriever(root: Path, path: str = "toolbench-demo/data/retriever/G1_demo",
                             val_fraction: float = 0.1, seed: int = 0) -> ToolDataset:
    """A ToolBench retriever folder (``path`` absolute or relative to the data root)."""
    folder = Path(path) if Path(path).is_absolute() else root / path
    catalog, skipped = Catalog(), Counter()
    doc_tool = _read_corpus(folder / "corpus.tsv", catalog, skipped)
    filt = QueryFilter(_REASONS, skipped)
    queries: list[Query] = []
    split_of: dict[str, str] = {}
    files = []
    for split in ("train", "test"):
        qrels_path, text_path = folder / f"qrels.{split}.tsv", folder / f"{split}.query.txt"
        if not qrels_path.exists() and not text_path.exists():
            continue
        files += [str(qrels_path), str(text_path)]
        texts, qrels = _read_queries(text_path, skipped), _read_qrels(qrels_path)
        for qid in qrels:
            if qid not in texts:
                raise DataError(f"qrels name query {qid!r} that {text_path.name} lacks", qrels_path)
            if qid in split_of:
                raise DataError(f"query {qid!r} is in both {split_of[qid]} and {split}", qrels_path)
        for qid, text in texts.items():
            if qid not in qrels:
                skipped["query without qrels"] += 1
                continue
            if filt.blank(text):
                continue
            tools = filt.resolve(doc_tool.get(docid) for docid in qrels[qid])
            if filt.empty(tools):
                continue
            split_of[qid] = split
            queries.append(Query(qid, text, tools, split))
    if not files:
        raise DataError("no qrels.{train,test}.tsv / {train,test}.query.txt found", folder)
    queries = carve_val(queries, val_fraction, seed)
    notes = {"files": [str(folder / "corpus.tsv"), *files], "docids": len(doc_tool), "val_fraction": val_fraction,
             "seed": seed}
    return catalog.dataset("toolbench-retriever", queries, skipped, notes)
