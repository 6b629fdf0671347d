"""MCP catalogs: servers (agents) that own tools, and tasks annotated with the tools they need.

Two catalog layouts are read:

* a **servers file** (the LiveMCPBench layout): a JSON list of
  ``{"name", "description", "category", "tools": {<config name>: {"tools": [{"name", "description",
  "inputSchema"}]}}}``; ``tools`` may also be a plain list of tool objects;
* a **tools/list folder**: one ``<server>.json`` per server holding an MCP ``tools/list`` response,
  either the result (``{"tools": [...]}``) or the whole JSON-RPC reply (``{"result": {"tools": [...]}}``).

An agent is a server (id = its name); a tool id is ``"<server>::<tool name>"``, its ``parameters``
the ``inputSchema``. So that two entries never make one id (``a`` + ``b::c`` and ``a::b`` + ``c``) and an
id splits back at its first ``::``, a server name holding ``::`` or ending in ``:`` and a tool name
holding ``::`` are refused with a DataError naming the file and the entry (ids are what users,
gold annotations and clients write, so they are refused rather than silently escaped; names that
follow the MCP spec, ``[A-Za-z0-9_.-]``, never hold ``::``).

Catalog text is bounded: a server's or tool's name or description, or a tool's ``inputSchema`` (as
JSON), longer than ``max_text_chars`` (default 65,536 characters) is a DataError naming the file and
the entry; the option (``data.options.max_text_chars``, ``toolgraph index sync --max-text-chars``)
raises it. One 32 MB description otherwise costs a minute of indexing, gigabytes of memory and 32 MB
in every response that returns the tool. A catalog with no tool at all is a DataError naming it. A tool name repeated inside one server (say, in two configs) is a DataError naming
the server, unless ``on_duplicate`` is ``keep-first`` or ``keep-last`` (the repeat is then counted in
``skipped``); the same option governs a ``task_id`` repeated in the tasks file.

Tasks: a JSON list of ``{"task_id", "Question", "category", "Annotator Metadata": {"Steps": "1. …\\n2. …",
"Tools": "1. tool_a\\n2. tool_b", "Number of tools": "2"}}``. Steps and gold tools come from the numbered
lines (an unnumbered line continues the item before it). A gold name is matched exactly, then without
case, and may be qualified by its server (``server/tool``, ``server.tool``, ``server::tool``,
``server: tool``). A bare name that several servers share is resolved by ``duplicate_names``:

* ``category`` (default): the server whose category equals the task's, if exactly one; otherwise the
  first such server in catalog order;
* ``first``: the first server in catalog order; ``all``: every copy is gold; ``drop``: the name is left
  out of the gold set; ``error``: a DataError naming the task.

Every decision is counted in ``notes`` (``ambiguous_names_in_catalog``, ``ambiguous_gold``,
``resolved_by_category``, ``resolved_by_catalog_order``, ``tools_count_mismatch``), and gold names not in
the catalog in ``skipped``. All tasks are test queries (MCP benchmarks ship no training split).

Queries (labels for your own catalog, the ``queries`` option): a JSONL file, one
``{"query": "...", "tools": ["server::tool", ...], "id"?: "...", "split"?: "train"|"val"|"test"}`` per
line. A tool is named as in tasks (a tool id, ``server/tool``, ``server.tool``, a bare name resolved by
``duplicate_names``; no category, so ``category`` falls back to catalog order). Unlike a task's, a label
is checked strictly: a line that is not a JSON object, has no ``query`` text, an empty ``tools`` list,
a tool the catalog does not hold (with the closest ids), an unknown key or split, or an ``id`` used
before (unless ``on_duplicate``) is a DataError naming the file and the line, and nothing of the file
is kept. A line without ``split`` is a test query; without ``id`` its id is ``line-<n>``.
"""

from __future__ import annotations

import difflib
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from toolgraph.data.formats import Duplicates, iter_jsonl, read_json
from toolgraph.data.schema import SPLITS, Agent, Query, Tool, ToolDataset
from toolgraph.data.sources._filter import QueryFilter, SkipReasons
from toolgraph.errors import ConfigError, DataError
from toolgraph.registry import DATASETS

DUPLICATE_POLICIES = ("category", "first", "all", "drop", "error")
_NUMBERED = re.compile(r"^\s*(\d+)\s*[.)]\s*(.*)$")
_QUALIFIED = re.compile(r"^(.+?)\s*(?:::|/|:|\.)\s*(.+)$")
_REASONS = SkipReasons(empty_text="task with an empty Question", no_tools="task with no gold tool in the catalog")
MAX_TEXT_CHARS = 65536  # per name, description or inputSchema (as JSON) of one catalog entry
QUERY_KEYS = ("query", "tools", "id", "split")  # one line of a queries file


def check_size(value: Any, field: str, where: str, path: Path | None, limit: int) -> None:
    """A DataError naming the entry when ``value`` (text, or a schema measured as JSON) is over ``limit``."""
    if value is None or limit is None:
        return
    n = len(value) if isinstance(value, str) else len(json.dumps(value, ensure_ascii=False, default=str))
    if n > limit:
        raise DataError(f"{where}: {field!r} is {n:,} characters, over the limit of {limit:,}; shorten it, or raise "
                        "the limit (data.options.max_text_chars; toolgraph index sync --max-text-chars)", path)


def _tool_objects(entry: Any, where: str, path: Path, limit: int = MAX_TEXT_CHARS) -> list[dict]:
    """The tool objects of a server's ``tools`` field (dict of configs, or a list); names, descriptions
    and schemas over ``limit`` characters are refused."""
    if isinstance(entry, list):
        groups = [("tools", entry)]
    elif isinstance(entry, dict):
        groups = []
        for config, body in entry.items():
            tools = body.get("tools") if isinstance(body, dict) else None
            if not isinstance(tools, list):
                raise DataError(f"{where}: tools[{config!r}] needs a 'tools' list", path)
            groups.append((config, tools))
    else:
        raise DataError(f"{where}: 'tools' must be an object of configs or a list, got {type(entry).__name__}", path)
    out = []
    for config, tools in groups:
        for j, t in enumerate(tools):
            if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"].strip():
                raise DataError(f"{where}: tools[{config!r}][{j}] needs a non-empty 'name'", path)
            entry_where = f"{where}: tools[{config!r}][{j}]"
            check_size(t["name"], "name", entry_where, path, limit)  # before the name is quoted in any message
            entry_where += f" ({t['name'][:80]!r})"
            check_size(t.get("description"), "description", entry_where, path, limit)
            check_size(t.get("inputSchema"), "inputSchema", entry_where, path, limit)
            out.append(t)
    return out


class CatalogBuilder:
    """Servers and their tools, in catalog order; counts what it merges."""

    def __init__(self, on_duplicate: str = "error", max_text_chars: int = MAX_TEXT_CHARS) -> None:
        if not isinstance(max_text_chars, int) or isinstance(max_text_chars, bool) or max_text_chars < 1:
            raise ConfigError(f"max_text_chars: must be a whole number >= 1, got {max_text_chars!r}")
        self.max_text_chars = max_text_chars
        self.agents: dict[str, Agent] = {}
        self.tools: dict[str, Tool] = {}
        self.skipped: Counter = Counter()
        self.repeats = Duplicates("tool inside a server", on_duplicate, self.skipped)

    def add_server(self, name: str, description: Any, category: Any, tools: list[dict],
                   path: Path | None = None) -> None:
        if name in self.agents:
            raise DataError(f"server {name!r} appears twice", path)
        check_size(name, "name", f"server {name[:80]!r}", path, self.max_text_chars)
        if "::" in name or name.endswith(":"):  # ids are "<server>::<tool>": this one could make another's
            raise DataError(f"server {name!r}: a server name may not hold '::' or end with ':' (tool ids are "
                            "'<server>::<tool>', so it could give two tools one id); rename the server", path)
        description = description or ""
        if not isinstance(description, str) or (category is not None and not isinstance(category, str)):
            raise DataError(f"server {name!r}: 'description' and 'category' must be strings", path)
        check_size(description, "description", f"server {name!r}", path, self.max_text_chars)
        self.agents[name] = Agent(name, name, description.strip(), category or None)
        for t in tools:
            if "::" in t["name"]:
                raise DataError(f"server {name!r} tool {t['name']!r}: a tool name may not hold '::' (tool ids are "
                                "'<server>::<tool>', so it could give two tools one id); rename the tool", path)
            tid = f"{name}::{t['name'].strip()}"
            desc = t.get("description") or ""
            if not isinstance(desc, str):
                raise DataError(f"server {name!r} tool {t['name']!r}: 'description' must be a string", path)
            if self.repeats.add(tid, path, f"server {name!r}") == "skip":
                continue
            self.tools[tid] = Tool(tid, t["name"].strip(), desc.strip(), agent=name, category=category or None,
                                   parameters=t.get("inputSchema"))


def read_servers_file(path: Path, builder: CatalogBuilder) -> None:
    data = read_json(path)
    if not isinstance(data, list):
        raise DataError(f"expected a JSON list of servers, got {type(data).__name__}", path)
    for i, s in enumerate(data):
        if not isinstance(s, dict):
            raise DataError(f"server #{i}: expected an object, got {type(s).__name__}", path)
        name = s.get("name")
        if not isinstance(name, str) or not name.strip():
            raise DataError(f"server #{i}: missing or empty 'name'", path)
        check_size(name, "name", f"server #{i}", path, builder.max_text_chars)  # before it is quoted below
        where = f"server #{i} ({name!r})"
        if "tools" not in s:
            raise DataError(f"{where}: missing 'tools'", path)
        builder.add_server(name.strip(), s.get("description"), s.get("category"),
                           _tool_objects(s["tools"], where, path, builder.max_text_chars), path)


def read_tools_list(path: Path, builder: CatalogBuilder, server: str | None = None) -> None:
    """One ``tools/list`` response (result or JSON-RPC reply); the server is named by the file stem."""
    data = read_json(path)
    body = data.get("result", data) if isinstance(data, dict) else None
    if not isinstance(body, dict) or not isinstance(body.get("tools"), list):
        raise DataError("expected a tools/list response: {'tools': [...]} or {'result': {'tools': [...]}}", path)
    name = server or path.stem
    info = body.get("server") if isinstance(body.get("server"), dict) else {}
    builder.add_server(name, info.get("description", ""), info.get("category"),
                       _tool_objects(body["tools"], f"server {name!r}", path, builder.max_text_chars), path)


def read_catalog(servers: Path | None = None, tools_lists: Path | None = None,
                 on_duplicate: str = "error", max_text_chars: int = MAX_TEXT_CHARS) -> CatalogBuilder:
    """Servers file and/or a folder (or single file) of tools/list responses, in that order;
    ``on_duplicate``: what a tool name repeated inside one server does (error, keep-first, keep-last);
    ``max_text_chars``: the longest name, description or schema (as JSON) an entry may have. A catalog
    without any tool is a DataError."""
    if servers is None and tools_lists is None:
        raise ConfigError("an MCP catalog needs 'servers' (a servers JSON file) or 'tools_lists' (a folder)")
    builder = CatalogBuilder(on_duplicate, max_text_chars)
    if servers is not None:
        read_servers_file(servers, builder)
    if tools_lists is not None:
        files = sorted(tools_lists.glob("*.json")) if tools_lists.is_dir() else [tools_lists]
        if not files:
            raise DataError("no *.json tools/list responses in this folder", tools_lists)
        for f in files:
            read_tools_list(f, builder)
    if not builder.tools:
        shown = " and ".join(str(p) for p in (servers, tools_lists) if p is not None)
        raise DataError("the catalog has no tools (an empty server list, or servers without tools); nothing to "
                        "index: give a catalog with at least one tool", shown)
    return builder


def numbered_items(text: str) -> list[str]:
    """``"1. a\\n2. b"`` -> ["a", "b"]; unnumbered lines continue the item before them (or stand
    alone when nothing is numbered yet)."""
    items: list[str] = []
    numbered = False
    for line in (text or "").splitlines():
        m = _NUMBERED.match(line)
        if m:
            items.append(m.group(2).strip())
            numbered = True
        elif line.strip():
            if numbered and items:
                items[-1] = f"{items[-1]} {line.strip()}".strip()
            else:
                items.append(line.strip())
    return [i for i in items if i]


class GoldResolver:
    """Tool names in task annotations -> tool ids, applying the duplicate-name policy."""

    def __init__(self, builder: CatalogBuilder, policy: str):
        if policy not in DUPLICATE_POLICIES:
            raise ConfigError(f"data.options.duplicate_names: {policy!r} is not one of {DUPLICATE_POLICIES}")
        self.policy = policy
        self.agents = builder.agents
        self.by_name: dict[str, list[str]] = defaultdict(list)
        self.by_lower: dict[str, list[str]] = defaultdict(list)
        for tid, t in builder.tools.items():
            self.by_name[t.name].append(tid)
            self.by_lower[t.name.lower()].append(tid)
        self.counts: Counter = Counter()
        self.counts["ambiguous_names_in_catalog"] = sum(len(v) > 1 for v in self.by_name.values())

    def _candidates(self, name: str) -> list[str]:
        if name in self.by_name:
            return self.by_name[name]
        m = _QUALIFIED.match(name)
        if m and m.group(1).strip() in self.agents:
            server, tool = m.group(1).strip(), m.group(2).strip()
            hit = [t for t in self.by_name.get(tool, []) + self.by_lower.get(tool.lower(), []) if t.startswith(f"{server}::")]
            if hit:
                return hit[:1]
        return self.by_lower.get(name.lower(), [])

    def label(self, name: str, path: Path, line: int, skipped: Counter) -> list[str]:
        """A tool named in a queries file -> its ids; a name the catalog does not hold, or an ambiguous
        bare name under ``duplicate_names: error``, is a DataError naming the file and the line."""
        cands = self._candidates(name)
        if not cands:
            close = self.close_ids(name)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise DataError(f"tool {name!r} is not in the catalog{hint} (name a tool as server::tool)", path, line)
        if len(cands) > 1 and self.policy == "error":
            raise DataError(f"tool {name!r} is offered by several servers {[c.split('::')[0] for c in cands]}; "
                            "write it as server::tool, or set data.options.duplicate_names (category, first, all, "
                            "drop)", path, line)
        return self.resolve(name, None, f"line {line}", skipped)

    def close_ids(self, name: str, n: int = 3) -> list[str]:
        """Up to ``n`` tool ids spelled like ``name``: the server's own tools when ``name`` is qualified
        by a server of the catalog, else tools of a similar name, then similar ids."""
        m = _QUALIFIED.match(name)
        if m and m.group(1).strip() in self.agents:
            server = m.group(1).strip()
            own = [t.split("::", 1)[1] for ids in self.by_name.values() for t in ids if t.startswith(f"{server}::")]
            return [f"{server}::{t}" for t in difflib.get_close_matches(m.group(2).strip(), own, n=n, cutoff=0.6)]
        ids = [t for hit in difflib.get_close_matches(name, list(self.by_name), n=n, cutoff=0.6) for t in self.by_name[hit]]
        ids += difflib.get_close_matches(name, [t for v in self.by_name.values() for t in v], n=n, cutoff=0.6)
        return list(dict.fromkeys(ids))[:n]

    def resolve(self, name: str, category: str | None, task: str, skipped: Counter) -> list[str]:
        cands = self._candidates(name)
        if not cands:
            skipped["gold tool not in the catalog (name dropped)"] += 1
            return []
        if len(cands) == 1:
            return cands
        self.counts["ambiguous_gold"] += 1
        if self.policy == "error":
            servers = [self.agents[c.split("::")[0]].id for c in cands]
            raise DataError(f"task {task!r}: tool {name!r} is offered by several servers {servers}; "
                            "set data.options.duplicate_names (category, first, all, drop)")
        if self.policy == "all":
            return list(cands)
        if self.policy == "drop":
            skipped["ambiguous gold tool (dropped by policy)"] += 1
            return []
        if self.policy == "category" and category:
            same = [c for c in cands if self.agents[c.split("::")[0]].category == category]
            if len(same) == 1:
                self.counts["resolved_by_category"] += 1
                return same
            cands = same or cands
        self.counts["resolved_by_catalog_order"] += 1
        return cands[:1]


def read_tasks(path: Path, resolver: GoldResolver, skipped: Counter, notes: dict,
               on_duplicate: str = "error") -> list[Query]:
    data = read_json(path)
    if not isinstance(data, list):
        raise DataError(f"expected a JSON list of tasks, got {type(data).__name__}", path)
    filt = QueryFilter(_REASONS, skipped)
    repeats = Duplicates("task_id", on_duplicate, skipped)
    queries: dict[str, Query] = {}
    mismatch = 0
    for i, rec in enumerate(data):
        if not isinstance(rec, dict):
            raise DataError(f"task #{i}: expected an object, got {type(rec).__name__}", path)
        tid, text = rec.get("task_id"), rec.get("Question")
        if not isinstance(tid, (str, int)) or not isinstance(text, str):
            raise DataError(f"task #{i}: needs 'task_id' and a 'Question' string", path)
        meta = rec.get("Annotator Metadata")
        if not isinstance(meta, dict) or not isinstance(meta.get("Tools", ""), str) \
                or not isinstance(meta.get("Steps", ""), str):
            raise DataError(f"task #{i} ({tid!r}): 'Annotator Metadata' needs string 'Tools' and 'Steps'", path)
        qid = str(tid)
        verdict = repeats.add(qid, path, f"task #{i}")
        if verdict == "skip":
            continue
        if verdict == "replace":  # keep-last: this record decides, even when it is then left out
            queries.pop(qid, None)
        if filt.blank(text):
            continue
        names = numbered_items(meta.get("Tools", ""))
        declared = meta.get("Number of tools")
        if declared is not None and str(declared).strip().isdigit() and int(str(declared).strip()) != len(names):
            mismatch += 1
        category = rec.get("category") if isinstance(rec.get("category"), str) else None
        gold = tuple(dict.fromkeys(t for name in names for t in resolver.resolve(name, category, qid, skipped)))
        if filt.empty(gold):
            continue
        steps = tuple(numbered_items(meta.get("Steps", ""))) or None
        queries[qid] = Query(qid, text.strip(), gold, "test", steps)
    notes["tools_count_mismatch"] = mismatch
    return list(queries.values())


def read_queries(path: Path, resolver: GoldResolver, skipped: Counter, on_duplicate: str = "error",
                 taken: dict[str, str] | None = None) -> list[Query]:
    """Labelled requests, one JSON object per line (see the module docstring); every bad line is a
    DataError naming ``path`` and the line, raised before anything is returned. ``taken``: ids already
    used (by the tasks file) -> where; a query reusing one is an error."""
    repeats = Duplicates("query id", on_duplicate, skipped)
    queries: dict[str, Query] = {}
    for line, rec in iter_jsonl(path):
        if not isinstance(rec, dict):
            raise DataError(f'expected a JSON object {{"query": ..., "tools": [...]}}, got {type(rec).__name__}',
                            path, line)
        unknown = sorted(set(rec) - set(QUERY_KEYS))
        if unknown:
            raise DataError(f"unknown key(s) {unknown}; a line holds {', '.join(QUERY_KEYS)}", path, line)
        text = rec.get("query")
        if not isinstance(text, str) or not text.strip():
            raise DataError("missing or empty 'query' (the request's text)", path, line)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise DataError("'query' holds a lone surrogate (\\ud800-\\udfff) that UTF-8 cannot encode", path, line) from None
        names = rec.get("tools")
        if not isinstance(names, list) or not names:
            raise DataError("'tools' must be a non-empty list of tool ids (server::tool) or names", path, line)
        if not all(isinstance(n, str) and n.strip() for n in names):
            raise DataError(f"'tools' must hold non-empty strings, got {names!r:.80}", path, line)
        qid = rec.get("id", f"line-{line}")
        if isinstance(qid, bool) or not isinstance(qid, (str, int)) or not str(qid).strip():
            raise DataError(f"'id' must be a non-empty string, got {qid!r:.60}", path, line)
        qid = str(qid)
        split = rec.get("split", "test")
        if split not in SPLITS:
            raise DataError(f"'split' must be one of {', '.join(SPLITS)}, got {split!r:.60}", path, line)
        if taken and qid in taken:
            raise DataError(f"id {qid!r} is also a task_id in {taken[qid]}; give the query another id", path, line)
        gold = tuple(dict.fromkeys(t for n in names for t in resolver.label(n.strip(), path, line, skipped)))
        verdict = repeats.add(qid, path, line)
        if verdict == "skip":
            continue
        if verdict == "replace":
            queries.pop(qid, None)
        if not gold:  # every name was an ambiguous one left out by duplicate_names: drop
            skipped["query with no gold tool left (duplicate_names: drop)"] += 1
            continue
        queries[qid] = Query(qid, text.strip(), gold, split)
    return list(queries.values())


def _path(root: Path, p: str | None) -> Path | None:
    if p is None:
        return None
    q = Path(p)
    return q if q.is_absolute() else root / q


@DATASETS.register("mcp")
def load_mcp(root: Path, servers: str | None = None, tasks: str | None = None, tools_lists: str | None = None,
             duplicate_names: str = "category", name: str = "mcp", on_duplicate: str = "error",
             max_text_chars: int = MAX_TEXT_CHARS, queries: str | None = None) -> ToolDataset:
    """An MCP catalog (``servers`` file and/or ``tools_lists`` folder) with optional ``tasks`` (the
    LiveMCPBench layout) and/or ``queries`` (a JSONL file of labelled requests). Relative paths resolve
    against the data root. ``on_duplicate``: a tool name repeated inside one server, a repeated task_id
    or query id, is an ``error`` (default), or ``keep-first`` / ``keep-last``.
    ``max_text_chars``: the longest name, description or inputSchema (as JSON) of one entry."""
    builder = read_catalog(_path(root, servers), _path(root, tools_lists), on_duplicate, max_text_chars)
    resolver = GoldResolver(builder, duplicate_names)
    skipped = Counter(builder.skipped)
    notes: dict[str, Any] = {"servers": servers, "tools_lists": tools_lists, "tasks": tasks, "queries": queries,
                             "duplicate_names": duplicate_names, "on_duplicate": on_duplicate}
    found = read_tasks(_path(root, tasks), resolver, skipped, notes, on_duplicate) if tasks is not None else []
    if queries is not None:
        taken = {q.id: str(_path(root, tasks)) for q in found}
        found += read_queries(_path(root, queries), resolver, skipped, on_duplicate, taken)
    notes.update(resolver.counts)
    return ToolDataset(name, list(builder.tools.values()), found, list(builder.agents.values()), [], +skipped, notes)
