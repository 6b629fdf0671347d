"""ToolBench (Qin et al., "ToolLLM: Facilitating Large Language Models to Master 16000+ Real-world
APIs", ICLR 2024; github.com/OpenBMB/ToolBench) query files, test sets G1/G2/G3 and training files.

Record shape (one JSON array per file): ``query``, ``query_id``, ``api_list`` (the candidate APIs the
query was generated from, each a full RapidAPI doc) and ``relevant APIs`` ([tool_name, api_name]
pairs, in the source's order). A Tool is one API: ``name`` = api_name, ``agent`` = the RapidAPI tool
(tool_name), ``category`` = category_name, ``parameters`` = {"required": [...], "optional": [...]},
``returns`` = template_response.

Tool ids are ``"{tool_name}::{api_name}"``, names whitespace-stripped (the data has ``"Morpheus
Predictions "``). ToolBench's tool identity is really (category, tool_name): a (tool, api) pair can
come with different docs (G1: ``👋 Demo Project`` under Media/Sports/Events, ``Currency
Converter_v2::Convert`` under Financial/Finance; COLT's G3 corpus: four ``Priceline com Provider`` APIs). Dropping them would point queries at a doc
they were not shown, so a later differing doc gets ``"~2"``, ``"~3"`` appended (in reading order) and
each relevant pair is resolved against the query's own ``api_list`` first, i.e. to the exact doc it
was shown. Identical copies of a doc (the catalog is a union over queries) are merged, not counted.

Test sets: StableToolBench (Guo et al., ACL Findings 2024) solvable queries (default) or DRAFT's
(Qu et al., ICLR 2025) copies of the original unfiltered G2_category/G3_instruction sets
(``source="draft"``). For G3, ``corpus="colt"`` uses COLT's (Qu et al., CIKM 2024) processed
1,419-API ToolBench-G3 corpus as the catalog instead of the union of candidates; relevant pairs are
then matched by (tool_name, api_name) and the query's own api_list is ignored.

Agents carry no description in these files (only a name and a category). ``agent_docs="initial"``
(or ``"draft"``) takes the RapidAPI tool descriptions DRAFT ships for 282 tools, matched by name:
they cover DRAFT's G2 catalog (277 of 280 agents) but few of the others — mind the coverage (in
``notes["agent_docs"]``) before comparing agent-description methods.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from toolgraph.data.formats import iter_jsonl, read_json
from toolgraph.data.schema import Agent, Query, Tool, ToolDataset
from toolgraph.data.sources._filter import QueryFilter, SkipReasons
from toolgraph.data.sources.beir import parse_toolbench_doc
from toolgraph.data.splits import carve_val
from toolgraph.errors import ConfigError, DataError
from toolgraph.registry import DATASETS

Key = tuple[str, str]
_STABLE = "toolbench-stabletoolbench/solvable_queries/test_instruction"
_DRAFT = "toolbench-draft-testsets/dataset/ToolBench/test_data"
_COLT_G3 = "toolbench-colt/datasets/ToolBenchG3/corpus.jsonl"
_REASONS = SkipReasons(empty_text="query with empty text", no_tools="query with no relevant API in the catalog",
                       dropped_tool="relevant API not in the catalog (pair dropped)",
                       repeated_tool="repeated relevant API within a query",
                       repeated_query="repeated query id (first kept)")
_AGENT_DOCS = {"initial": "toolbench-draft-testsets/dataset/ToolBench/tool_instruction/Initial.json",
               "draft": "toolbench-draft-testsets/dataset/ToolBench/tool_instruction/DRAFT.json"}
# group -> source -> {subset: file}
_TEST_FILES = {
    "G1": {"stabletoolbench": {s: f"{_STABLE}/G1_{s}.json" for s in ("instruction", "category", "tool")}},
    "G2": {"stabletoolbench": {s: f"{_STABLE}/G2_{s}.json" for s in ("instruction", "category")},
           "draft": {"category": f"{_DRAFT}/G2.json"}},
    "G3": {"stabletoolbench": {"instruction": f"{_STABLE}/G3_instruction.json"},
           "draft": {"instruction": f"{_DRAFT}/G3.json"}},
}


class Catalog:
    """APIs keyed by stripped (tool_name, api_name); equal docs merge, differing ones get ``~n`` ids."""

    def __init__(self) -> None:
        self.tools: dict[str, Tool] = {}
        self.by_key: dict[Key, list[str]] = {}
        self.agents: dict[str, Agent] = {}

    def add(self, tool_name: str, api_name: str, category: str | None, description: str,
            parameters: Any, returns: Any) -> str:
        key = (tool_name.strip(), api_name.strip())
        new = Tool("", key[1], description, agent=key[0], category=category, parameters=parameters, returns=returns)
        ids = self.by_key.setdefault(key, [])
        for tid in ids:
            if replace(self.tools[tid], id="") == new:
                return tid
        base, n = f"{key[0]}::{key[1]}", len(ids) + 1
        tid = base if n == 1 else f"{base}~{n}"
        while tid in self.tools:  # only when names themselves hold '::' or '~n'
            n += 1
            tid = f"{base}~{n}"
        ids.append(tid)
        self.tools[tid] = replace(new, id=tid)
        self.agents.setdefault(key[0], Agent(key[0], key[0], "", category))
        return tid

    def add_api(self, api: Any, where: str, path: Path, line: int | None = None) -> str:
        """Add one ToolBench API doc (an ``api_list`` entry or a corpus.tsv document)."""
        if not isinstance(api, dict):
            raise DataError(f"{where}: expected an API object, got {type(api).__name__}", path, line)
        for field in ("tool_name", "api_name"):
            if not isinstance(api.get(field), str) or not api[field].strip():
                raise DataError(f"{where}: missing or empty {field!r}", path, line)
        params = {"required": api.get("required_parameters", []), "optional": api.get("optional_parameters", [])}
        return self.add(api["tool_name"], api["api_name"], api.get("category_name"), api.get("api_description") or "",
                        params, api.get("template_response"))

    def describe_agents(self, root: Path, which: str | None, notes: dict) -> None:
        """Give agents the RapidAPI tool descriptions DRAFT ships (``initial``: the original docs,
        ``draft``: DRAFT's rewritten ones), matched by tool name; how many matched goes to ``notes``."""
        if which is None:
            return
        if which not in _AGENT_DOCS:
            raise ConfigError(f"toolbench: agent_docs must be null, 'initial' or 'draft', got {which!r}")
        path = root / _AGENT_DOCS[which]
        data = read_json(path)
        if not isinstance(data, dict):
            raise DataError(f"expected an object of tool docs, got {type(data).__name__}", path)
        docs: dict[str, str] = {}
        for key, doc in data.items():
            if not isinstance(doc, dict) or not isinstance(doc.get("tool_name"), str):
                raise DataError(f"tool doc {key!r}: missing 'tool_name'", path)
            docs.setdefault(doc["tool_name"].strip(), (doc.get("tool_description") or "").strip())
        matched = 0
        for aid, agent in self.agents.items():
            if docs.get(aid):
                self.agents[aid] = replace(agent, description=docs[aid])
                matched += 1
        notes["agent_docs"] = {"file": str(path), "agents_described": matched, "agents": len(self.agents)}

    def dataset(self, name: str, queries: list[Query], skipped: Counter, notes: dict) -> ToolDataset:
        return ToolDataset(name, list(self.tools.values()), queries, list(self.agents.values()), [], +skipped, notes)


@dataclass
class Record:
    qid: str
    text: str
    relevant: list[Key]  # stripped (tool_name, api_name) pairs, source order
    shown: dict[Key, str]  # key -> tool id of the doc this query's api_list gave (first if repeated)


def read_records(path: Path, prefix: str, catalog: Catalog) -> list[Record]:
    """Parse a ToolBench query file; its api_list docs go into ``catalog``."""
    data = read_json(path)
    if not isinstance(data, list):
        raise DataError(f"expected a JSON array of query records, got {type(data).__name__}", path)
    out = []
    for i, rec in enumerate(data):
        if not isinstance(rec, dict):
            raise DataError(f"record {i}: expected an object, got {type(rec).__name__}", path)
        for field, typ in (("query", str), ("query_id", (int, str)), ("api_list", list), ("relevant APIs", list)):
            if field not in rec:
                raise DataError(f"record {i}: missing {field!r}", path)
            if not isinstance(rec[field], typ):
                raise DataError(f"record {i}: {field!r} has type {type(rec[field]).__name__}", path)
        where = f"record {i} (query_id {rec['query_id']})"
        shown: dict[Key, str] = {}
        for j, api in enumerate(rec["api_list"]):
            tid = catalog.add_api(api, f"{where} api_list[{j}]", path)
            shown.setdefault((api["tool_name"].strip(), api["api_name"].strip()), tid)
        relevant = []
        for pair in rec["relevant APIs"]:
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
                raise DataError(f"{where}: relevant API {pair!r} is not a [tool_name, api_name] pair", path)
            relevant.append((pair[0].strip(), pair[1].strip()))
        out.append(Record(f"{prefix}:{rec['query_id']}", rec["query"], relevant, shown))
    return out


def _resolve(r: Record, key: Key, catalog: Catalog, use_shown: bool) -> tuple[str | None, bool]:
    """The tool id of a relevant pair (None if unknown) and whether it took the catalog fallback."""
    tid = r.shown.get(key) if use_shown else None
    if tid is None and key in catalog.by_key:
        return catalog.by_key[key][0], True
    return tid, False


def to_queries(records: list[Record], catalog: Catalog, split: str, skipped: Counter, notes: dict,
               use_shown: bool = True) -> list[Query]:
    """Resolve relevant pairs: the doc the query was shown, else the first doc of that key in ``catalog``
    (another query's api_list, or the COLT corpus); how many took the fallback goes to ``notes``."""
    filt = QueryFilter(_REASONS, skipped)
    queries: list[Query] = []
    fallback = 0
    for r in records:
        if filt.repeated(r.qid) or filt.blank(r.text):
            continue
        resolved = [_resolve(r, key, catalog, use_shown) for key in r.relevant]
        fallback += sum(by_name for _, by_name in resolved)
        tools = filt.resolve(tid for tid, _ in resolved)
        if filt.empty(tools):
            continue
        filt.keep(r.qid)
        queries.append(Query(r.qid, r.text, tools, split))
    notes["relevant pairs resolved by name in the catalog"] = fallback
    return queries


def read_colt_corpus(path: Path) -> Catalog:
    """COLT's BEIR corpus.jsonl: one ToolBench doc string per line, parsed with beir's regex."""
    catalog = Catalog()
    for lineno, obj in iter_jsonl(path):
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise DataError("corpus line needs a 'text' string", path, lineno)
        category, tool, api, desc, params, returns = parse_toolbench_doc(obj["text"], path, lineno)
        if not tool.strip() or not api.strip():
            raise DataError("empty tool_name or api_name", path, lineno)
        catalog.add(tool, api, category, desc, params, returns)
    return catalog


def _load_test_group(root: Path, group: str, source: str, subsets: Sequence[str] | None,
                     corpus: str = "candidates", agent_docs: str | None = None) -> ToolDataset:
    files = _TEST_FILES[group].get(source)
    if files is None:
        raise ConfigError(f"toolbench-{group.lower()}: source {source!r} not available; "
                          f"choose from {sorted(_TEST_FILES[group])}")
    subsets = list(files) if subsets is None else list(subsets)
    bad = [s for s in subsets if s not in files]
    if bad or not subsets:
        raise ConfigError(f"toolbench-{group.lower()} ({source}): subsets {bad or subsets} not available; "
                          f"choose from {list(files)}")
    if corpus not in ("candidates", "colt"):
        raise ConfigError(f"toolbench-{group.lower()}: corpus must be 'candidates' or 'colt', got {corpus!r}")
    candidates, records = Catalog(), []
    for s in subsets:
        records += read_records(root / files[s], f"{group}_{s}", candidates)
    skipped: Counter = Counter()
    notes: dict[str, Any] = {"files": [str(root / files[s]) for s in subsets], "source": source,
                             "subsets": subsets, "corpus": corpus}
    if corpus == "candidates":
        catalog, queries = candidates, to_queries(records, candidates, "test", skipped, notes)
    else:
        catalog = read_colt_corpus(root / _COLT_G3)
        queries = to_queries(records, catalog, "test", skipped, notes, use_shown=False)
        wanted = {k for r in records for k in r.relevant}
        notes.update(corpus_file=str(root / _COLT_G3),
                     colt_relevant_found=sum(k in catalog.by_key for k in wanted), colt_relevant_total=len(wanted))
    catalog.describe_agents(root, agent_docs, notes)
    return catalog.dataset(f"toolbench-{group.lower()}", queries, skipped, notes)


@DATASETS.register("toolbench-g1")
def load_g1(root: Path, source: str = "stabletoolbench", subsets: list[str] | None = None,
            agent_docs: str | None = None) -> ToolDataset:
    """G1 (single-tool) test queries: instruction/category/tool subsets; catalog = union of candidates."""
    return _load_test_group(root, "G1", source, subsets, agent_docs=agent_docs)


@DATASETS.register("toolbench-g2")
def load_g2(root: Path, source: str = "stabletoolbench", subsets: list[str] | None = None,
            agent_docs: str | None = None) -> ToolDataset:
    """G2 (intra-category multi-tool) test queries; ``source="draft"`` = original G2_category (199)."""
    return _load_test_group(root, "G2", source, subsets, agent_docs=agent_docs)


@DATASETS.register("toolbench-g3")
def load_g3(root: Path, source: str = "stabletoolbench", subsets: list[str] | None = None,
            corpus: str = "candidates", agent_docs: str | None = None) -> ToolDataset:
    """G3 (intra-collection multi-tool) test queries; ``corpus="colt"``: COLT's 1,419-API catalog."""
    return _load_test_group(root, "G3", source, subsets, corpus, agent_docs)


@DATASETS.register("toolbench-instructions")
def load_instructions(root: Path, path: str | list[str] = "toolbench-demo/data_example/instruction/G1_query.json",
                      val_fraction: float = 0.1, seed: int = 0) -> ToolDataset:
    """ToolBench training query files (data/instruction/G*_query.json): all train, val carved.
    Query ids are ``"{file stem}:{query_id}"``; ``path`` may list several files."""
    paths = [Path(p) if Path(p).is_absolute() else root / p for p in ([path] if isinstance(path, str) else path)]
    if len({p.stem for p in paths}) < len(paths):
        raise ConfigError(f"toolbench-instructions: file names must differ (they prefix query ids): {paths}")
    catalog, records = Catalog(), []
    for p in paths:
        records += read_records(p, p.stem, catalog)
    skipped: Counter = Counter()
    notes: dict[str, Any] = {"files": [str(p) for p in paths], "val_fraction": val_fraction, "seed": seed}
    queries = carve_val(to_queries(records, catalog, "train", skipped, notes), val_fraction, seed)
    return catalog.dataset("toolbench-instructions", queries, skipped, notes)
