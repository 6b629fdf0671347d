"""Tool-dependency pair data in the TDI format of TGR (Tool Graph Retriever, 2025).

One pair per line: ``{"tool_a", "tool_b", "label", "doc_a", "doc_b", "source", "kind", "weight"}``
with ``label`` in ``a_needs_b`` (a needs b's output first) / ``none`` / ``b_needs_a``.

Built from real dependency annotations (``Dependency(source needs target)`` of each adapter):
ToolLinkOS ``depends_on``, Seal-Tools and NesTools ``API_call_k`` chains, API-Bank token/data
chains, and UltraTool ``task_links`` (an order, not always a dependency: flagged, down-weighted,
kept out of the test set). Tool ids are namespaced ``dataset:id``.

Splits (all seeded):
* **test** shares no tool with training: per source, tools are ordered breadth-first over the
  dependency graph (components in random order) and the first ``test_fraction`` go to test, so
  neighbourhoods stay together; an edge across the split is dropped and counted.
* **finetune**: the remaining pairs at their real class ratio (``hard_negatives`` +
  ``easy_negatives`` "none" pairs per edge), each pair in a random orientation;
  ``val_fraction`` of it (stratified by label) is held out as **val** (``val_split: pairs``), or,
  with ``val_split: tools``, val is carved like test: ``val_fraction`` of the training side's tools,
  so model selection sees unseen tools as test does (pairs share tools with training otherwise).
* **pretrain**: class-balanced, from the finetune pairs only: every edge in both orientations
  (reversing a pair gives the other class) plus as many "none" pairs as one direction has.

Negatives never use a pair that is a known dependency in any split of its dataset (test chains
included), so a hidden dependency is never labelled "none". Hard negatives are pairs used together
in one request (train/val requests only), or sharing an agent or a category; easy ones are random.

Each tool also keeps its schema fields (``TDISet.fields``: name, description, parameter and return
names, category, agent), written as ``fields_a`` / ``fields_b`` on every JSONL line: what the
schema discriminator (``tasks/discriminator_schema.py``) reads.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from toolgraph.data.formats import iter_jsonl
from toolgraph.data.loading import load_dataset
from toolgraph.data.schema import Query, Tool, ToolDataset, param_names
from toolgraph.errors import ConfigError, DataError
from toolgraph.files import atomic_path, write_text_atomic
from toolgraph.registry import DATASETS

LABELS = ("a_needs_b", "none", "b_needs_a")
LABEL_INDEX = {name: i for i, name in enumerate(LABELS)}
SETS = ("pretrain", "finetune", "val", "test")
FIELD_KEYS = ("name", "description", "parameters", "returns", "category", "agent")


def default_sources() -> list[dict[str, Any]]:
    # evaluation chains of API-Bank (test levels) and Seal-Tools (test) stay out of training:
    # TGR-d is measured on them
    return [
        {"dataset": "toollinkos"},
        {"dataset": "nestools"},
        {"dataset": "seal-tools", "options": {"dependency_splits": ["val"]}},
        {"dataset": "api-bank", "options": {"dependency_splits": ["train"]}},
        {"dataset": "ultratool", "options": {"dependency_splits": ["train", "val"]}, "weight": 0.5,
         "flag": "order", "test": False},
    ]


@dataclass
class TDIConfig:
    sources: list[dict[str, Any]] = field(default_factory=default_sources)
    test_fraction: float = 0.2  # of each source's tools (breadth-first groups)
    val_fraction: float = 0.2  # of the finetuning pairs
    hard_negatives: int = 2  # "none" pairs per edge sharing a request, agent or category
    easy_negatives: int = 1  # random "none" pairs per edge
    tool_text: str = "default"
    val_split: str = "pairs"  # pairs: stratified pairs of the training side | tools: tool-disjoint, like test
    seed: int = 0


@dataclass(frozen=True)
class Pair:
    tool_a: str
    tool_b: str
    label: str
    source: str
    kind: str  # the edge kind, or hard / easy for negatives
    weight: float = 1.0


@dataclass
class TDISet:
    documents: dict[str, str]  # namespaced tool id -> text
    pairs: dict[str, list[Pair]]  # set name -> pairs
    dropped: Counter = field(default_factory=Counter)
    config: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, dict[str, Any]] = field(default_factory=dict)  # tool id -> FIELD_KEYS (schema names)

    def counts(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, pairs in self.pairs.items():
            by_source: dict[str, Counter] = defaultdict(Counter)
            for p in pairs:
                by_source[p.source][p.label] += 1
            out[name] = {"total": len(pairs), "per_class": {lab: sum(c[lab] for c in by_source.values()) for lab in LABELS},
                         "per_source": {s: {lab: c[lab] for lab in LABELS} for s, c in sorted(by_source.items())},
                         "tools": len({t for p in pairs for t in (p.tool_a, p.tool_b)})}
        out["dropped"] = dict(sorted(self.dropped.items()))
        return out

    def tools_of(self, name: str) -> set[str]:
        return {t for p in self.pairs[name] for t in (p.tool_a, p.tool_b)}


# ---- building ----------------------------------------------------------------------------------
def _check_source(i: int, spec: Any) -> dict[str, Any]:
    if not isinstance(spec, dict) or "dataset" not in spec:
        raise ConfigError(f"tdi.sources[{i}]: expected a mapping with a 'dataset' key, got {spec!r}")
    unknown = set(spec) - {"dataset", "options", "weight", "flag", "test"}
    if unknown:
        raise ConfigError(f"tdi.sources[{i}]: unknown key(s) {sorted(unknown)}; "
                          "expected dataset, options, weight, flag, test")
    return {"options": {}, "weight": 1.0, "flag": None, "test": True, **spec}


def tool_fields(tool: Tool) -> dict[str, Any]:
    """The schema fields a dependency is made of: b's returns feed a's parameters."""
    return {"name": tool.name, "description": tool.description, "parameters": param_names(tool.parameters),
            "returns": param_names(tool.returns), "category": tool.category, "agent": tool.agent}


def build_tdi(cfg: TDIConfig, root: str | Path | None = None) -> TDISet:
    if not 0 <= cfg.test_fraction < 1 or not 0 <= cfg.val_fraction < 1:
        raise ConfigError("tdi: test_fraction and val_fraction must be in [0, 1)")
    if cfg.val_split not in ("pairs", "tools"):
        raise ConfigError(f"tdi: val_split must be 'pairs' or 'tools', got {cfg.val_split!r}")
    rng = random.Random(cfg.seed)
    documents: dict[str, str] = {}
    fields: dict[str, dict[str, Any]] = {}
    train_pairs: list[Pair] = []
    val_pairs: list[Pair] = []
    test_pairs: list[Pair] = []
    dropped: Counter = Counter()
    for i, raw in enumerate(cfg.sources):
        spec = _check_source(i, raw)
        name = spec["dataset"]
        ds = load_dataset(name, root, **spec["options"])
        # every known dependency of the dataset, whatever split it came from: never a negative
        full = ds if "dependency_splits" not in spec["options"] else load_dataset(
            name, root, **{k: v for k, v in spec["options"].items() if k != "dependency_splits"})
        known = {frozenset((d.source, d.target)) for d in full.dependencies}
        splits = set(ds.notes.get("dependency_splits") or ("train", "val", "test"))
        sides, d = _source_pairs(ds, known, splits, spec, cfg, rng)
        dropped.update({f"{ds.name}: {k}": v for k, v in d.items()})
        for t in ds.tools:
            documents[f"{ds.name}:{t.id}"] = t.document(cfg.tool_text)
            fields[f"{ds.name}:{t.id}"] = tool_fields(t)
        train_pairs += sides["train"]
        val_pairs += sides["val"]
        test_pairs += sides["test"]
    if cfg.val_split == "pairs":
        val, finetune = _stratified_split(train_pairs, cfg.val_fraction, rng)
    else:
        val, finetune = val_pairs, train_pairs
        rng.shuffle(finetune)
    pretrain = _balanced(finetune, rng)
    pairs = {"pretrain": pretrain, "finetune": finetune, "val": val, "test": test_pairs}
    return TDISet(documents, pairs, dropped, asdict(cfg), fields)


def _source_pairs(ds, known: set, splits: set, spec: dict, cfg: TDIConfig,
                  rng: random.Random) -> tuple[dict[str, list[Pair]], Counter]:
    name, weight, flag = ds.name, float(spec["weight"]), spec["flag"]
    dropped: Counter = Counter()
    edges: dict[tuple[str, str], str] = {}
    for dep in ds.dependencies:
        if dep.source == dep.target:
            dropped["self-dependency"] += 1
        elif (dep.target, dep.source) in edges:
            dropped["pair with a dependency both ways (label ambiguous)"] += 1
            del edges[(dep.target, dep.source)]
        else:
            edges.setdefault((dep.source, dep.target), flag or dep.kind or "dependency")
    tool_ids = sorted(t.id for t in ds.tools)
    test_tools = _test_tools(tool_ids, list(edges), cfg.test_fraction if spec["test"] else 0.0, rng)
    side = {t: ("test" if t in test_tools else "train") for t in tool_ids}
    if cfg.val_split == "tools" and spec["test"]:  # val carved like test (a source kept out of test stays out)
        rest = [t for t in tool_ids if side[t] == "train"]
        for t in _test_tools(rest, [e for e in edges if side[e[0]] == side[e[1]] == "train"], cfg.val_fraction, rng):
            side[t] = "val"
    out: dict[str, list[Pair]] = {"train": [], "val": [], "test": []}
    n_edges = Counter()
    for (a, b), kind in sorted(edges.items()):
        if side[a] != side[b]:
            dropped["edge across the tool-disjoint split"] += 1
            continue
        out[side[a]].append(_oriented(f"{name}:{a}", f"{name}:{b}", "a_needs_b", name, kind, weight, rng))
        n_edges[side[a]] += 1
    hard = _hard_candidates(ds, splits)
    for s in out:
        members = [t for t in tool_ids if side[t] == s]
        taken = set()
        pool = [p for p in hard if side[p[0]] == s and side[p[1]] == s and frozenset(p) not in known]
        rng.shuffle(pool)
        hard_want = cfg.hard_negatives * n_edges[s]
        for a, b in pool[:hard_want]:
            taken.add(frozenset((a, b)))
            out[s].append(_oriented(f"{name}:{a}", f"{name}:{b}", "none", name, "hard", weight, rng))
        short = max(0, hard_want - len(pool))  # keep the class ratio: random pairs fill the gap
        if short:
            dropped[f"hard negatives short, filled with random pairs ({s})"] += short
        want, tries = cfg.easy_negatives * n_edges[s] + short, 0
        budget = 50 * want + 100  # a tiny dense catalog may have too few unlinked pairs
        while want > 0 and len(members) > 1 and tries < budget:
            tries += 1
            a, b = rng.sample(members, 2)
            key = frozenset((a, b))
            if key in known or key in taken:
                continue
            taken.add(key)
            want -= 1
            out[s].append(_oriented(f"{name}:{a}", f"{name}:{b}", "none", name, "easy", weight, rng))
        if want:
            dropped[f"easy negatives not found ({s})"] += want
    return out, dropped


def _hard_candidates(ds, splits: set) -> list[tuple[str, str]]:
    """Unordered pairs used in one request, or sharing an owner or category (sorted, deduplicated)."""
    pairs: set[tuple[str, str]] = set()
    for q in ds.queries:
        if q.split in splits:
            tools = sorted(set(q.tools))
            pairs.update((a, b) for i, a in enumerate(tools) for b in tools[i + 1:])
    groups: dict[str, list[str]] = defaultdict(list)
    for t in ds.tools:
        for key in (f"agent={t.agent}" if t.agent else None, f"category={t.category}" if t.category else None):
            if key:
                groups[key].append(t.id)
    for members in groups.values():
        if 1 < len(members) <= 50:  # a catch-all category of hundreds of tools is not "hard"
            members = sorted(members)
            pairs.update((a, b) for i, a in enumerate(members) for b in members[i + 1:])
    return sorted(pairs)


def _test_tools(tool_ids: list[str], edges: list[tuple[str, str]], fraction: float, rng: random.Random) -> set[str]:
    """The first ``fraction`` of tools in a breadth-first order over the (undirected) dependency
    graph, components visited in random order: a test side made of whole neighbourhoods."""
    if fraction <= 0:
        return set()
    adj: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        adj[a].append(b)
        adj[b].append(a)
    linked = sorted(adj)
    rng.shuffle(linked)
    order, seen = [], set()
    for start in linked:
        if start in seen:
            continue
        seen.add(start)
        frontier = [start]
        while frontier:
            order += frontier
            nxt = []
            for t in frontier:
                for u in sorted(adj[t]):
                    if u not in seen:
                        seen.add(u)
                        nxt.append(u)
            frontier = nxt
    test = set(order[: round(fraction * len(order))])
    rest = [t for t in tool_ids if t not in adj]  # tools without edges: negatives only
    rng.shuffle(rest)
    return test | set(rest[: round(fraction * len(rest))])


def _oriented(a: str, b: str, label: str, source: str, kind: str, weight: float, rng: random.Random) -> Pair:
    """(a, b, label) or the reversed pair with the mirrored label, by a coin flip."""
    if rng.random() < 0.5:
        return Pair(a, b, label, source, kind, weight)
    return reverse(Pair(a, b, label, source, kind, weight))


def reverse(p: Pair) -> Pair:
    mirrored = {"a_needs_b": "b_needs_a", "b_needs_a": "a_needs_b", "none": "none"}[p.label]
    return Pair(p.tool_b, p.tool_a, mirrored, p.source, p.kind, p.weight)


def _stratified_split(pairs: list[Pair], fraction: float, rng: random.Random) -> tuple[list[Pair], list[Pair]]:
    by_label: dict[str, list[Pair]] = defaultdict(list)
    for p in pairs:
        by_label[p.label].append(p)
    held, kept = [], []
    for lab in LABELS:
        group = by_label[lab]
        rng.shuffle(group)
        n = round(fraction * len(group))
        held += group[:n]
        kept += group[n:]
    rng.shuffle(held)
    rng.shuffle(kept)
    return held, kept


def _balanced(finetune: list[Pair], rng: random.Random) -> list[Pair]:
    """Every edge in both orientations, plus as many "none" pairs as there are edges."""
    edges = [p for p in finetune if p.label != "none"]
    both = [q for p in edges for q in (p, reverse(p))]
    negatives = [p for p in finetune if p.label == "none"]
    rng.shuffle(negatives)
    out = both + negatives[: len(edges)]
    rng.shuffle(out)
    return out


# ---- on disk -------------------------------------------------------------------------------------
def write_tdi(tdi: TDISet, folder: str | Path) -> Path:
    """One JSONL per set, each line a self-contained pair with both documents, plus stats.json."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, pairs in tdi.pairs.items():
        with atomic_path(folder / f"{name}.jsonl") as tmp, tmp.open("w", encoding="utf-8") as f:
            for p in pairs:
                row = {"tool_a": p.tool_a, "tool_b": p.tool_b, "label": p.label,
                       "doc_a": tdi.documents[p.tool_a], "doc_b": tdi.documents[p.tool_b],
                       "source": p.source, "kind": p.kind, "weight": p.weight}
                if p.tool_a in tdi.fields and p.tool_b in tdi.fields:
                    row |= {"fields_a": tdi.fields[p.tool_a], "fields_b": tdi.fields[p.tool_b]}
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    stats = {"counts": tdi.counts(), "config": tdi.config}
    write_text_atomic(folder / "stats.json", json.dumps(stats, indent=2) + "\n")
    return folder


def read_pairs(path: str | Path, fields: dict[str, dict[str, Any]] | None = None) -> tuple[list[Pair], dict[str, str]]:
    """Pairs and documents of one TDI JSONL file; errors name the file and line. Each line's optional
    ``fields_a`` / ``fields_b`` (schema names) go into ``fields`` when given."""
    pairs, docs = [], {}
    for lineno, row in iter_jsonl(path):
        if not isinstance(row, dict):
            raise DataError("expected a JSON object", path, lineno)
        for key in ("tool_a", "tool_b", "label", "doc_a", "doc_b"):
            if not isinstance(row.get(key), str) or not row[key].strip():
                raise DataError(f"missing or empty string field {key!r}", path, lineno)
        if row["label"] not in LABEL_INDEX:
            raise DataError(f"label {row['label']!r} is not one of {list(LABELS)}", path, lineno)
        if row["tool_a"] == row["tool_b"]:
            raise DataError(f"a tool paired with itself ({row['tool_a']!r})", path, lineno)
        weight = row.get("weight", 1.0)
        if not isinstance(weight, (int, float)) or weight <= 0:
            raise DataError(f"weight must be a positive number, got {weight!r}", path, lineno)
        for key, doc in (("tool_a", "doc_a"), ("tool_b", "doc_b")):
            if docs.setdefault(row[key], row[doc]) != row[doc]:
                raise DataError(f"tool {row[key]!r} has two different documents in this file", path, lineno)
        for key, name in (("tool_a", "fields_a"), ("tool_b", "fields_b")):
            if name in row and fields is not None:
                fields[row[key]] = _check_fields(row[name], f"{name} of {row[key]!r}", path, lineno)
        pairs.append(Pair(row["tool_a"], row["tool_b"], row["label"], str(row.get("source", "")),
                          str(row.get("kind", "")), float(weight)))
    return pairs, docs


def _check_fields(value: Any, what: str, path: Any, lineno: int) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DataError(f"{what}: expected an object with keys {list(FIELD_KEYS)}", path, lineno)
    for key in ("parameters", "returns"):
        names = value.get(key, [])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise DataError(f"{what}: {key!r} must be a list of strings, got {names!r}", path, lineno)
    if not isinstance(value.get("name"), str) or not value["name"].strip():
        raise DataError(f"{what}: missing or empty 'name'", path, lineno)
    return {k: value.get(k, [] if k in ("parameters", "returns") else None) for k in FIELD_KEYS}


def read_tdi(folder: str | Path) -> TDISet:
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError("TDI folder not found (build one with: toolgraph data tdi build OUT)", folder)
    documents: dict[str, str] = {}
    fields: dict[str, dict[str, Any]] = {}
    pairs: dict[str, list[Pair]] = {}
    for name in SETS:
        path = folder / f"{name}.jsonl"
        if path.is_file():
            pairs[name], docs = read_pairs(path, fields)
            documents.update(docs)
    if not pairs:
        raise DataError(f"no {'/'.join(SETS)}.jsonl files in the TDI folder", folder)
    return TDISet(documents, pairs, fields=fields)


# ---- the same edges as a retrieval dataset: "which tools does this tool need?" -------------------
LINK_QUERY_PREFIX = "needs: "  # query = a dependent tool's document; gold = its prerequisites


def document_tool(tool_id: str, document: str) -> Tool:
    """A Tool whose rendered document is exactly ``document`` (``name: rest``): the form the link
    retriever is trained and queried on, whatever the source's own fields were."""
    head, _, rest = document.partition(": ")
    return Tool(id=tool_id, name=head, description=rest)


def links_dataset(tdi: TDISet, name: str = "tdi-links") -> ToolDataset:
    """A ToolDataset whose queries are dependent tools (``needs: <document>``) and whose gold tools
    are their prerequisites: train from the finetune set, val and test from theirs (test tools
    appear in no training edge). A bi-encoder trained on it proposes candidate pairs for graph
    construction (``toolgraph.depgraph``), where plain embedding similarity misses most
    dependencies (a prerequisite rarely reads like the tool that needs it)."""
    tools = [document_tool(tid, doc) for tid, doc in sorted(tdi.documents.items())]
    queries = []
    for set_name, split in (("finetune", "train"), ("val", "val"), ("test", "test")):
        needs: dict[str, list[str]] = defaultdict(list)
        for p in tdi.pairs.get(set_name, []):
            if p.label == "a_needs_b":
                needs[p.tool_a].append(p.tool_b)
            elif p.label == "b_needs_a":
                needs[p.tool_b].append(p.tool_a)
        for tool, prereqs in sorted(needs.items()):
            queries.append(Query(id=f"{split}:{tool}", text=LINK_QUERY_PREFIX + tdi.documents[tool],
                                 tools=tuple(dict.fromkeys(prereqs)), split=split))
    return ToolDataset(name, tools, queries, notes={"tdi": tdi.config})


@DATASETS.register("tdi-links")
def load_tdi_links(root: Path, **options: Any) -> ToolDataset:
    """``tdi-links``: the TDI dependency edges as a retrieval dataset (queries: dependent tools; gold
    tools: their prerequisites), built from the real sources in place. Options are TDIConfig keys."""
    unknown = sorted(set(options) - set(TDIConfig.__dataclass_fields__))
    if unknown:
        raise ConfigError(f"data.options: unknown option(s) {unknown} for dataset 'tdi-links'; "
                          f"it takes {sorted(TDIConfig.__dataclass_fields__)}")
    return links_dataset(build_tdi(TDIConfig(**options), root))
