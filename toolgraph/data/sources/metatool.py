"""MetaTool / ToolE (Huang et al., "MetaTool Benchmark for Large Language Models: Deciding Whether to
Use Tools and Which to Use", ICLR 2024; github.com/HowieHwong/MetaTool), ``dataset/`` folder.

Catalog: ``plugin_des.json`` (199 tools: name -> description). 152 of them are ChatGPT plugins that
``plugin_info.json`` documents (``name_for_model``, ``name_for_human``, ``description_for_human`` =
the plugin_des text, and the longer, functional ``description_for_model``). The other 47 are the
paper's *merged* tools (several overlapping plugins folded into one, e.g. FinanceTool, NewsTool);
``big_tool_des.json`` lists exactly these 47 with the same text as plugin_des, so it adds no tool
and no description: we read it only to record the names in ``notes["merged_tools"]`` (they have no
description_for_model). ``description="model"`` (default) uses description_for_model where
plugin_info has one and the plugin_des text otherwise; ``description="human"`` uses plugin_des only
(the text MetaTool itself embeds). Tool id = name = the plugin_des key (name_for_model); there is no
owner level, so no agents.

Queries: ``data/all_clean_data.csv`` (Query, Tool; one tool each) and
``data/multi_tool_query_golden.json`` (497 queries with two tools, in the source's order, which is
not a call order). Identical texts (after stripping whitespace) are one query: repeats with the same
gold are skipped; a text given *different* gold tools (12 single-tool texts, e.g. "What's the
weather like today?" -> WeatherTool / word_sneak) is an ambiguous label, skipped by default
(``conflicts="skip"``) or merged into one multi-label query in first-seen order
(``conflicts="merge"``). Ids: ``s<row>`` (CSV data row, from 0) and ``m<index>``.

No split exists: a seeded query-level split (``seeded_assign``; test 0.2, val 0.1, train the rest).
"""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

from toolgraph.data.formats import read_json, read_object_counting_repeats, require_fields, utf8_errors
from toolgraph.data.schema import Query, Tool, ToolDataset
from toolgraph.data.sources._filter import QueryFilter, SkipReasons
from toolgraph.data.splits import seeded_assign
from toolgraph.errors import ConfigError, DataError
from toolgraph.registry import DATASETS

_REASONS = SkipReasons(empty_text="query with empty text",
                       unknown_tool="query naming a tool missing from plugin_des.json",
                       repeated_tool="tool repeated in a query's gold list")


def _object(path: Path, skipped: Counter) -> dict:
    data, repeats = read_object_counting_repeats(path)
    skipped[f"tool name repeated in {path.name} (first kept)"] += repeats
    for key, value in data.items():
        if not isinstance(value, str):
            raise DataError(f"tool {key!r}: description must be a string, got {type(value).__name__}", path)
    return data


def _csv_rows(path: Path) -> list[tuple[int, str, str]]:
    """(data row index, query, tool); DataError naming file:line on a bad header or row."""
    if not path.is_file():
        raise DataError("file not found", path)
    rows = []
    with utf8_errors(path), path.open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        try:
            header = next(reader, None)
            if not header or "Query" not in header or "Tool" not in header:
                raise DataError(f"header must name 'Query' and 'Tool' columns, got {header}", path, 1)
            qi, ti = header.index("Query"), header.index("Tool")
            for row in reader:
                if not row:
                    continue
                if len(row) != len(header):
                    raise DataError(f"expected {len(header)} columns, got {len(row)}", path, reader.line_num)
                rows.append((len(rows), row[qi], row[ti]))
        except csv.Error as e:
            raise DataError(f"malformed CSV: {e}", path, reader.line_num) from None
    return rows


def _read_info(path: Path, catalog: dict, skipped: Counter) -> dict[str, dict]:
    """plugin_info.json: name_for_model -> record, for plugins of ``catalog`` (first kept)."""
    info_list = read_json(path)
    if not isinstance(info_list, list):
        raise DataError(f"expected a JSON array, got {type(info_list).__name__}", path)
    info: dict[str, dict] = {}
    for i, obj in enumerate(info_list):
        require_fields(obj, {"name_for_model": str, "description_for_model": str}, path, what=f"record {i}")
        name = obj["name_for_model"]
        if name in info:
            skipped["plugin_info.json entry repeating a plugin name (first kept)"] += 1
        elif name not in catalog:
            skipped["plugin_info.json entry for a plugin not in plugin_des.json"] += 1
        else:
            info[name] = obj
    return info


def _tools(catalog: dict, info: dict[str, dict], description: str, path: Path) -> list[Tool]:
    tools = []
    for name, text in catalog.items():
        if not name.strip():
            raise DataError("empty tool name", path)
        desc = info[name]["description_for_model"] if description == "model" and name in info else text
        tools.append(Tool(name, name, desc.strip() or text))
    return tools


def _read_queries(folder: Path, filt: QueryFilter) -> list[tuple[str, str, tuple[str, ...]]]:
    """(id, text, gold) in reading order: the single-tool CSV first, then the two-tool file."""
    records: list[tuple[str, str, tuple[str, ...]]] = []
    for row, text, tool in _csv_rows(folder / "data" / "all_clean_data.csv"):
        records.append((f"s{row}", text.strip(), (tool.strip(),)))
    multi_path = folder / "data" / "multi_tool_query_golden.json"
    multi = read_json(multi_path)
    if not isinstance(multi, list):
        raise DataError(f"expected a JSON array, got {type(multi).__name__}", multi_path)
    for i, obj in enumerate(multi):
        require_fields(obj, {"query": str, "tool": list}, multi_path, what=f"record {i}")
        if not obj["tool"] or not all(isinstance(t, str) for t in obj["tool"]):
            raise DataError(f"record {i}: 'tool' must be a non-empty list of strings", multi_path)
        records.append((f"m{i}", obj["query"].strip(), filt.gold([t.strip() for t in obj["tool"]])))
    return records


def _merge_texts(records: list[tuple[str, str, tuple[str, ...]]], catalog: dict, conflicts: str,
                 filt: QueryFilter) -> list[tuple[str, str, tuple[str, ...]]]:
    """One query per distinct text (see the module docstring); the rest counted in ``filt.skipped``."""
    skipped = filt.skipped
    groups: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
    for qid, text, gold in records:
        if not filt.reject(text, gold, catalog):
            groups.setdefault(text, []).append((qid, gold))
    kept: list[tuple[str, str, tuple[str, ...]]] = []
    for text, group in groups.items():
        golds = {g for _, g in group}
        if len(golds) == 1:
            skipped["repeated query text with the same gold tools (first kept)"] += len(group) - 1
            kept.append((group[0][0], text, group[0][1]))
        elif conflicts == "skip":
            skipped["query text given different gold tools (ambiguous, all copies skipped)"] += len(group)
        else:
            skipped["query text given different gold tools (copies merged into the first)"] += len(group) - 1
            kept.append((group[0][0], text, tuple(dict.fromkeys(t for _, g in group for t in g))))
    return kept


@DATASETS.register("metatool")
def load_metatool(root: Path, description: str = "model", conflicts: str = "skip", test_fraction: float = 0.2,
                  val_fraction: float = 0.1, seed: int = 0) -> ToolDataset:
    """MetaTool / ToolE: 199 tools, 20k single-tool + 497 two-tool queries; seeded split."""
    if description not in ("model", "human"):
        raise ConfigError(f"metatool: description={description!r}; expected 'model' or 'human'")
    if conflicts not in ("skip", "merge"):
        raise ConfigError(f"metatool: conflicts={conflicts!r}; expected 'skip' or 'merge'")
    if min(test_fraction, val_fraction) < 0 or test_fraction + val_fraction > 1:
        raise ConfigError(f"metatool: test_fraction={test_fraction} and val_fraction={val_fraction} must be >= 0 "
                          "and sum to <= 1")
    folder = root / "metatool" / "dataset"
    skipped: Counter = Counter()
    catalog = _object(folder / "plugin_des.json", skipped)
    merged = _object(folder / "big_tool_des.json", skipped)
    info = _read_info(folder / "plugin_info.json", catalog, skipped)
    tools = _tools(catalog, info, description, folder / "plugin_des.json")
    filt = QueryFilter(_REASONS, skipped)
    kept = _merge_texts(_read_queries(folder, filt), catalog, conflicts, filt)

    part = seeded_assign([q[0] for q in kept], {"test": test_fraction, "val": val_fraction,
                                                 "train": 1 - test_fraction - val_fraction}, seed)
    queries = [Query(qid, text, gold, part[qid]) for qid, text, gold in kept]
    notes = {"files": [str(folder / f) for f in ("plugin_des.json", "plugin_info.json", "big_tool_des.json",
                                                 "data/all_clean_data.csv", "data/multi_tool_query_golden.json")],
             "description": description, "conflicts": conflicts, "test_fraction": test_fraction,
             "val_fraction": val_fraction, "seed": seed,
             "merged_tools": sorted(n for n in merged if n in catalog),
             "merged_tools_missing_from_catalog": sorted(n for n in merged if n not in catalog)}
    return ToolDataset("metatool", tools, queries, [], [], +skipped, notes)
