"""API-Bank (Li et al., "API-Bank: A Comprehensive Benchmark for Tool-Augmented LLMs", EMNLP 2023;
github.com/AlibabaResearch/DAMO-ConvAI/tree/main/api-bank), the benchmark of the Tool Graph Retriever.

Catalog: the union of every API spec in the snapshot, deduplicated by API name (tool id = name):
specs in the test prompts (level-1/2 ``API descriptions``), the specs ToolSearcher returns inside the
level-2 dialogues, level-3 ``apis`` and the lv3 training dialogues, then ``data/all_apis.csv``. When a
name has several definitions, the first in that order wins unless a later one has more of
description / input_parameters / output_parameters. Test specs come first because they match the
calls in the test dialogues; all_apis.csv is the runnable system's docstrings, which often disagree
(ModifyPassword lists no ``token``; QueryBalance takes ``account`` instead of ``token``). Conflicts are
counted in ``notes``. ToolSearcher is left out: it is the retrieval step a retriever replaces.

Queries, one per dialogue. API-Bank stores a dialogue with k API calls as k records (step i sees
calls 1..i-1 and their results; test records share a ``file``, lv3 training records extend the
previous record's input). We group them into ONE query: text = the User utterances up to the last
call (prompt and API descriptions stripped; the ``TIME: ...`` stamp of lv3 prompts removed), gold =
the APIs parsed from each step's ``API-Request: [Name(`` in call order, each once, ToolSearcher
steps left out. Level 3 is read from ``level-3.json`` (requirement + ``apis``), whose step prompts
are ``level-3-batch-inf*.json``. Splits: lv3 training -> train (val carved from it), test levels
1-3 -> test with ids ``l1-<file>``, ``l2-<file>``, ``l3-<index>``; lv3 ids are ``lv3-<first record>``.
Skipped (counted): dialogues calling an API no spec defines (2 lv3 calls of tools ToolSearcher never
returned), dialogues with only ToolSearcher calls, and a dialogue repeating an earlier one's text and
gold APIs (lv3 repeats some). Two lv3 outputs lack the brackets (``API-Request: Name(...)``); the
name is unambiguous, so they count.

Dependencies ("token chains", generalised): ``Dependency(B, A, kind)`` when, in some dialogue, an
earlier call of A returned the very value that a later call of B passes for parameter p, and p is
both an output parameter of A's spec and an input parameter of B's spec. kind = "token" when p is
``token`` (every API that takes a token depends on GetUserToken), else "data"; the parameter names
per edge are in ``notes["dependency_params"]``. Name matching alone is not enough (``status`` is an
output of dozens of APIs); the value flow in the data is the evidence. One schema rule completes the
token chains: every API with an input ``token`` depends on GetUserToken, API-Bank's token issuer,
even where no dialogue calls it (Transfer, QueryBankAccount, ...). Only API-Bank's own account APIs
take ``token``; RegisterUser's test spec also returns one, but no dialogue uses it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from toolgraph.data.schema import Dependency, Query, Tool, ToolDataset
from toolgraph.data.sources._filter import QueryFilter, SkipReasons
from toolgraph.data.sources.api_bank_read import (
    META_TOOL,
    Catalog,
    Dialogue,
    harvest_responses,
    read_csv,
    read_level3,
    read_test_level,
    read_train,
)
from toolgraph.data.sources.seal_tools import check_dependency_splits
from toolgraph.data.splits import carve_val
from toolgraph.errors import ConfigError
from toolgraph.registry import DATASETS

TOKEN_ISSUER = "GetUserToken"
_REASONS = SkipReasons(empty_text="dialogue with no User utterance",
                       no_tools="dialogue whose only calls are ToolSearcher",
                       unknown_tool="dialogue calling an API with no spec in the catalog",
                       repeated_tool="repeated call of an API already in the dialogue's gold list",
                       repeated_query="duplicate dialogue (same user text and gold APIs as an earlier one)")


def _read(paths: dict, chosen: list[int], skipped: Counter) -> tuple[Catalog, list[Dialogue], dict[str, str]]:
    """Every file, in the order that decides which spec of a name wins (see the module docstring): the
    catalog, the dialogues (training, then the ``chosen`` test levels) and all_apis.csv's scenarios."""
    cat = Catalog()
    by_level = {1: read_test_level(paths[1], 1, cat, skipped), 2: read_test_level(paths[2], 2, cat, skipped),
                3: read_level3(paths[3], cat, skipped)}
    dialogues = read_train(paths["train"], cat, skipped)
    harvest_responses(paths["responses"], cat, skipped)
    scenario = read_csv(paths["csv"], cat, skipped)
    for level, ds in by_level.items():
        if level in chosen:
            dialogues += ds
        else:
            skipped[f"level-{level} test dialogue left out by option levels"] += len(ds)
    return cat, dialogues, scenario


def _queries(dialogues: list[Dialogue], cat: Catalog, skipped: Counter) -> tuple[list[Query], dict[str, Dialogue]]:
    """One query per dialogue that passes the filter (ToolSearcher steps left out), and its dialogue by id."""
    filt = QueryFilter(_REASONS, skipped)
    queries: list[Query] = []
    kept: dict[str, Dialogue] = {}
    for d in dialogues:
        skipped["ToolSearcher call (retrieval meta-tool, not a gold tool)"] += d.steps.count(META_TOOL)
        names = [s for s in d.steps if s != META_TOOL]
        if None in names:
            skipped["dialogue with an API-Request naming no API"] += 1
            continue
        gold = tuple(dict.fromkeys(names))
        text = "\n".join(d.users)  # User utterances are stripped and non-empty: blank iff none
        if filt.reject(text, gold, cat.specs) or filt.repeated((d.split, text, gold)):
            continue
        filt.keep((d.split, text, gold))
        queries.append(Query(d.qid, text, filt.gold(names), d.split))
        kept[d.qid] = d
    return queries, kept


def _edges(dialogues: list[Dialogue], cat: Catalog) -> dict[tuple[str, str], list[str]]:
    """(consumer, producer) -> parameters whose value the producer's result handed to the consumer,
    then the token rule: GetUserToken issues every token (see the module docstring)."""
    edges: dict[tuple[str, str], list[str]] = {}
    for d in dialogues:
        for j, (b, args, _) in enumerate(d.calls):
            for p, v in args.items():
                if not v or p not in cat.params(b, "input_parameters"):
                    continue
                for a, _, result in reversed(d.calls[:j]):  # the nearest earlier producer
                    if a != b and result and v in result and p in cat.params(a, "output_parameters"):
                        params = edges.setdefault((b, a), [])
                        if p not in params:
                            params.append(p)
                        break
    for name in cat.specs:
        if TOKEN_ISSUER in cat.specs and name != TOKEN_ISSUER and "token" in cat.params(name, "input_parameters"):
            edges.setdefault((name, TOKEN_ISSUER), ["token"])
    return edges


@DATASETS.register("api-bank")
def load_api_bank(root: Path, levels: Sequence[int] = (1, 2, 3), val_fraction: float = 0.1, seed: int = 0,
                  dependency_splits: Sequence[str] | None = None, csv_category: bool = False,
                  val_from: str = "train") -> ToolDataset:
    """API-Bank (EMNLP'23): lv3 train dialogues, test levels 1-3; token/data dependencies.

    ``levels``: test levels to load (the catalog always holds every spec). ``dependency_splits``:
    splits whose dialogues may evidence an edge (default all; test chains are test labels).
    ``val_from``: ``train`` carves val from the lv3 training dialogues; ``test`` carves it from the test
    levels instead (the rest stays test), for tuning what only the test levels exercise: no lv3
    dialogue calls GetUserToken, while a third of the test dialogues do.
    ``csv_category``: set ``category`` to all_apis.csv's Chinese scenario (应用场景); off by default
    because only the 101 runnable APIs have one (no lv3 training API does), which would make test-side
    tool documents look different from training-side ones."""
    chosen = sorted(set(levels))
    if not chosen or not set(chosen) <= {1, 2, 3}:
        raise ConfigError(f"api-bank: option levels={list(levels)!r}; expected a non-empty subset of [1, 2, 3]")
    if val_from not in ("train", "test"):
        raise ConfigError(f"api-bank: option val_from={val_from!r}; expected 'train' or 'test'")
    dep_splits = check_dependency_splits(dependency_splits, "api-bank")
    folder = root / "api-bank" / "api-bank"
    paths = {1: folder / "test-data" / "level-1-api.json", 2: folder / "test-data" / "level-2-api.json",
             3: folder / "test-data" / "level-3.json", "train": folder / "training-data" / "lv3-api-train.json",
             "responses": folder / "training-data" / "lv3-response-train.json", "csv": folder / "data" / "all_apis.csv"}
    skipped: Counter = Counter()
    cat, dialogues, scenario = _read(paths, chosen, skipped)
    queries, kept = _queries(dialogues, cat, skipped)
    queries = carve_val(queries, val_fraction, seed, source=val_from)

    edges = _edges([replace(kept[q.id], split=q.split) for q in queries if q.split in dep_splits], cat)
    deps = [Dependency(b, a, "token" if "token" in ps else "data") for (b, a), ps in edges.items()]
    tools = [Tool(n, n, s["description"], category=scenario.get(n) if csv_category else None,
                  parameters=s.get("input_parameters"), returns=s.get("output_parameters"))
             for n, s in cat.specs.items()]
    notes = {"files": [str(p) for p in paths.values()], "levels": chosen, "val_fraction": val_fraction,
             "val_from": val_from,
             "seed": seed, "dependency_splits": sorted(dep_splits), "csv_category": csv_category,
             "excluded_tools": [META_TOOL], "spec_occurrences": cat.occurrences,
             "spec_origin": dict(Counter(cat.origin.values())),
             "names_with_conflicting_specs": sum(len(v) > 1 for v in cat.versions.values()),
             "dependency_params": {f"{b}->{a}": ps for (b, a), ps in edges.items()}}
    return ToolDataset("api-bank", tools, queries, [], deps, +skipped, notes)
