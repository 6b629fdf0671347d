"""``mixture``: the training splits of several datasets as one catalog, for a general retriever.

Every tool, agent and query id is prefixed with its dataset (``metatool::weather``), so tools of two
datasets never merge; the text datamodule reads the prefix to draw each training batch from one
dataset (its negatives come from one catalog; ``data.mixture_temperature`` sets how often each
dataset is drawn). Test splits are left out: a mixture trains; its model is tested on each dataset
itself (benchmarks/general.py, leave-one-dataset-out). ``test_as_train`` names datasets whose test
queries train instead (datasets published with a test split only): in a leave-one-dataset-out run
every dataset but the held-out one is training data, as in DomainBed's protocol.

No leakage: ``holdout`` names the datasets a model will be tested on. A training query whose
normalised text equals any query of a held-out dataset is dropped, and so is every training query
whose gold tools include a tool whose normalised name and description equal a held-out tool's
(the same API under two dataset names). ``near_duplicates`` is a JSON file of further mixture ids
to drop, ``{"queries": [...], "tools": [...]}`` (embedding near-duplicates, found by
benchmarks/general.py with an encoder). What was dropped is counted in ``skipped`` and
``notes["mixture"]``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from toolgraph.data import pseudo_queries, request_pieces
from toolgraph.data.formats import read_json
from toolgraph.data.loading import load_dataset
from toolgraph.data.schema import MIXTURE_SEP, Agent, Query, Tool, ToolDataset
from toolgraph.errors import ConfigError, DataError
from toolgraph.registry import DATASETS

SEP = MIXTURE_SEP


def normalize_text(text: str) -> str:
    """Lower case, every run of non-alphanumerics one space: ``"Get-Weather!"`` == ``"get weather"``."""
    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


def tool_key(tool: Tool) -> str:
    return normalize_text(f"{tool.name} {tool.description}")


def source_of(mixture_id: str) -> str:
    """The dataset a mixture id comes from (``metatool::weather`` -> ``metatool``)."""
    if SEP not in mixture_id:
        raise DataError(f"{mixture_id!r} is not a mixture id (dataset{SEP}id)")
    return mixture_id.split(SEP, 1)[0]


def source_groups(ds: ToolDataset, ids: Sequence[str]) -> list[int] | None:
    """For a mixture: the index of each id's source dataset (in sorted order of the mixed datasets),
    so batches and negatives can be kept within one dataset; None for any other dataset."""
    if "mixture" not in ds.notes:
        return None
    index = {name: i for i, name in enumerate(sorted(ds.notes["mixture"]))}
    return [index[source_of(i)] for i in ids]


def pinned_groups(ds: ToolDataset) -> tuple[frozenset[int], float] | None:
    """For a mixture with self-supervised components: their group indices (as ``source_groups``
    numbers them) and the share of training batches they get together; None otherwise."""
    share = ds.notes.get("self_supervised_share") if "mixture" in ds.notes else None
    if not share:
        return None
    parts = ds.notes["mixture"]
    return frozenset(i for i, name in enumerate(sorted(parts)) if parts[name].get("self_supervised")), float(share)


def _prefixed(name: str, ds: ToolDataset, splits: tuple[str, ...], test_as_train: bool = False
              ) -> tuple[list[Tool], list[Agent], list[Query]]:
    """The dataset's tools, agents and queries (of ``splits``) with ids prefixed by ``name``;
    ``test_as_train``: its test queries come as training queries."""
    p = f"{name}{SEP}"
    tools = [Tool(p + t.id, t.name, t.description, p + t.agent if t.agent else None, t.category, t.parameters,
                  t.returns) for t in ds.tools]
    agents = [Agent(p + a.id, a.name, a.description, a.category) for a in ds.agents]
    relabel = {"test": "train"} if test_as_train else {}
    queries = [Query(p + q.id, q.text, tuple(p + t for t in q.tools), relabel.get(q.split, q.split), q.steps)
               for q in ds.queries if relabel.get(q.split, q.split) in splits]
    return tools, agents, queries


def _leaked(holdout: list[ToolDataset]) -> tuple[set[str], set[str]]:
    """Normalised query texts and tool keys of every held-out dataset (all splits)."""
    texts = {normalize_text(q.text) for ds in holdout for q in ds.queries}
    keys = {tool_key(t) for ds in holdout for t in ds.tools}
    return texts, keys


SELF_SUPERVISED_KEYS = {"kinds": list, "catalogs": list, "share": (int, float), "max_tools": int, "seed": int}


def _self_supervised_spec(spec: Any) -> dict[str, Any]:
    """``data.options.self_supervised`` checked, its defaults filled in."""
    where = "data.options.self_supervised"
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected a mapping such as {{kinds: [ict], share: 0.2}}, got {spec!r}")
    for key, value in spec.items():
        if key not in SELF_SUPERVISED_KEYS:
            raise ConfigError(f"{where}.{key}: unknown key; expected one of {', '.join(SELF_SUPERVISED_KEYS)}")
        if not isinstance(value, SELF_SUPERVISED_KEYS[key]) or isinstance(value, bool):
            raise ConfigError(f"{where}.{key}: {value!r} has the wrong type")
    out = {"kinds": list(pseudo_queries.KINDS), "catalogs": [], "share": 0.2, "max_tools": 300, "seed": 0, **spec}
    bad = sorted(set(out["kinds"]) - set(pseudo_queries.KINDS))
    if bad or not out["kinds"]:
        raise ConfigError(f"{where}.kinds: {bad or out['kinds']} not among {list(pseudo_queries.KINDS)}")
    if not 0 < out["share"] < 1:
        raise ConfigError(f"{where}.share: {out['share']} is not a fraction of the batches in (0, 1)")
    if out["max_tools"] < 1:
        raise ConfigError(f"{where}.max_tools: {out['max_tools']} must be at least 1")
    return out


def self_supervised_parts(name: str, tools: list[Tool], spec: dict[str, Any]
                          ) -> list[tuple[str, list[Tool], list[Query]]]:
    """One mixture component per kind from a catalog's tools (``ssl-KIND@NAME``): the tools' views and
    their pseudo-queries (training split), ids prefixed with the component's name."""
    out = []
    for kind in spec["kinds"]:
        part = f"ssl-{kind}@{name}"
        found = pseudo_queries.pairs(tools, kind, spec["max_tools"], spec["seed"])
        views = [replace(view, id=f"{part}{SEP}{view.id}") for _, view in found]
        queries = [Query(f"{part}{SEP}{i}", text, (view.id,), "train") for i, ((text, _), view)
                   in enumerate(zip(found, views))]
        if queries:
            out.append((part, views, queries))
    return out


@DATASETS.register("mixture")
def load_mixture(root: Path, datasets: list[Any] | None = None, holdout: list[str] | str | None = None,
                 near_duplicates: str | None = None, splits: list[str] | None = None,
                 max_val_per_dataset: int | None = 500, test_as_train: list[str] | None = None,
                 self_supervised: dict[str, Any] | None = None, query_pieces: str | None = None) -> ToolDataset:
    """``datasets``: names, or ``{name: options}`` maps, of the datasets mixed (their train and val
    splits; ``splits`` to change). ``holdout``: dataset names nothing may leak from. ``max_val_per_dataset``:
    the first N val queries of each dataset (validation on the whole mixture is slow and adds little).
    ``test_as_train``: mixed datasets whose test queries train (their test split is then never a test).
    ``self_supervised``: pseudo-query components from the catalogs' own text (toolgraph/data/pseudo_queries.py),
    ``{kinds: [ict, name, params], catalogs: [queryless datasets], share: 0.2, max_tools: 300, seed: 0}``:
    each kind over each mixed dataset's tools (those not held out) and over ``catalogs``, one component
    per (kind, catalog); together they get ``share`` of the training batches. ``query_pieces``: a split
    rule (``clauses``, ``sentences``): every kept training query that needs several tools also trains
    as its pieces, each with the gold tool it names (toolgraph/data/request_pieces.py), in its own
    dataset's batches; a piece is checked for leaks like a query."""
    if not datasets:
        raise ConfigError("data.options.datasets: name the datasets of the mixture (e.g. [toollens, metatool])")
    specs: list[tuple[str, dict]] = []
    for item in datasets:
        if isinstance(item, str):
            specs.append((item, {}))
        elif isinstance(item, dict) and len(item) == 1:
            (name, opts), = item.items()
            specs.append((str(name), dict(opts or {})))
        else:
            raise ConfigError(f"data.options.datasets: {item!r} is neither a name nor {{name: options}}")
    names = [n for n, _ in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"data.options.datasets: a dataset named twice in {names}")
    holdout_names = [holdout] if isinstance(holdout, str) else list(holdout or [])
    if set(holdout_names) & set(names):
        raise ConfigError(f"data.options.holdout: {sorted(set(holdout_names) & set(names))} also mixed into training")
    as_train = [test_as_train] if isinstance(test_as_train, str) else list(test_as_train or [])
    if set(as_train) - set(names):
        raise ConfigError(f"data.options.test_as_train: {sorted(set(as_train) - set(names))} are not in "
                          f"data.options.datasets {names}")
    keep = tuple(splits or ("train", "val"))
    if query_pieces is not None and (not isinstance(query_pieces, str) or query_pieces not in set(request_pieces.SPLITS) - {"none"}):
        raise ConfigError(f"data.options.query_pieces: {query_pieces!r} is not a split rule; expected one of "
                          f"{sorted(set(request_pieces.SPLITS) - {'none'})} (or leave it out)")
    ssl = _self_supervised_spec(self_supervised) if self_supervised is not None else None
    if ssl and set(ssl["catalogs"]) & (set(names) | set(holdout_names)):
        raise ConfigError(f"data.options.self_supervised.catalogs: {sorted(set(ssl['catalogs']) & (set(names) | set(holdout_names)))} "
                          "already mixed or held out (a mixed dataset's tools give pairs already)")
    texts, keys = _leaked([load_dataset(h, root) for h in holdout_names])
    extra: dict[str, set[str]] = {"queries": set(), "tools": set()}
    if near_duplicates:
        found = read_json(Path(near_duplicates))
        if (not isinstance(found, dict) or set(found) - set(extra)
                or not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in found.values())):
            raise DataError("expected {\"queries\": [ids], \"tools\": [ids]} (lists of id strings)", near_duplicates)
        extra = {k: set(found.get(k, [])) for k in extra}

    tools: list[Tool] = []
    agents: list[Agent] = []
    queries: list[Query] = []
    skipped: Counter = Counter()
    report: dict[str, Any] = {}
    sources: list[tuple[str, list[Tool]]] = []  # (catalog, its tools not held out): self-supervised pairs
    for name, opts in [*specs, *((c, {}) for c in (ssl["catalogs"] if ssl else []))]:
        ds = load_dataset(name, root, **opts)
        t, a, q = _prefixed(name, ds, keep, name in as_train)
        leaked_tools = {x.id for x in t if tool_key(x) in keys} | (extra["tools"] & {x.id for x in t})
        if ssl:
            sources.append((name, [x for x in t if x.id not in leaked_tools]))
        if name not in names:
            agents += a  # a queryless catalog: pairs only (its views keep their owner)
            continue
        drop = Counter()
        kept: list[Query] = []
        val_seen = 0
        for query in q:
            if normalize_text(query.text) in texts:
                drop["query text also in a held-out dataset"] += 1
            elif query.id in extra["queries"]:
                drop["query near-duplicate of a held-out query (embedding)"] += 1
            elif leaked_tools.intersection(query.tools):
                drop["query using a tool also in a held-out dataset"] += 1
            elif query.split == "val" and max_val_per_dataset is not None and val_seen >= max_val_per_dataset:
                continue  # a cap, not a leak: not counted
            else:
                val_seen += query.split == "val"
                kept.append(query)
        pieces = []
        for piece in request_pieces.labelled_pieces(kept, {x.id: x for x in t}, query_pieces) if query_pieces else []:
            if normalize_text(piece.text) in texts:
                drop["piece text also in a held-out dataset"] += 1
            elif piece.id in extra["queries"]:
                drop["piece near-duplicate of a held-out query (embedding)"] += 1
            else:
                pieces.append(piece)
        tools += t
        agents += a
        queries += kept + pieces
        skipped.update({f"{name}: {reason}": n for reason, n in drop.items()})
        report[name] = {"tools": len(t), "tools_also_held_out": len(leaked_tools),
                        "train": sum(x.split == "train" for x in kept), "val": sum(x.split == "val" for x in kept),
                        "dropped": dict(drop), **({"pieces": len(pieces)} if query_pieces else {})}
    if not any(q.split == "train" for q in queries):
        raise DataError(f"mixture of {names}: no training query left (holdout {holdout_names})")
    for name, source_tools in sources:
        for part, views, pseudo in self_supervised_parts(name, source_tools, ssl):
            tools += views
            queries += pseudo
            report[part] = {"tools": len(views), "train": len(pseudo), "val": 0, "self_supervised": True}
    notes = {"mixture": report, "holdout": holdout_names, "near_duplicates": near_duplicates, "test_as_train": as_train,
             "self_supervised_share": ssl["share"] if ssl else None}
    return ToolDataset("mixture", tools, queries, agents, skipped=skipped, notes=notes)
