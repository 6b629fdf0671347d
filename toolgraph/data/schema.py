"""The canonical in-memory form of a tool catalog and its queries.

Every adapter in ``data/sources`` produces a :class:`ToolDataset`; every retriever and task
consumes one. The on-disk twin (JSONL) lives in ``data/formats.py``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from toolgraph.errors import DataError

SPLITS = ("train", "val", "test")
MIXTURE_SEP = "::"  # a mixture's ids are dataset::id (data/sources/mixture.py)


def natural_key(s: str) -> tuple:
    """Sort key for ids in natural order ("2" < "10"): tools are kept in this order everywhere, so
    ties in score are broken by tool id the same way in training, evaluation and serving."""
    return (0, int(s), "") if s.isdigit() else (1, 0, s)


@dataclass(frozen=True)
class Tool:
    id: str
    name: str
    description: str
    agent: str | None = None  # id of the owning Agent (RapidAPI tool, MCP server, library)
    category: str | None = None
    parameters: Any = None  # JSON-able schema, kept as the source wrote it
    returns: Any = None

    def document(self, style: str = "default") -> str:
        """Text an encoder reads. Name and description come first so truncation keeps them."""
        return render_tool(self, style)

    def to_dict(self) -> dict[str, Any]:
        """The tool as plain data with the fields that are None left out: a line of ``tools.jsonl``, an
        entry of a checkpoint's catalog; ``Tool(**tool.to_dict())`` is the tool again."""
        return {k: v for k, v in vars(self).items() if v is not None}


@dataclass(frozen=True)
class Agent:
    """The owner of tools: a RapidAPI tool (its APIs), an MCP server (its tools), a library."""

    id: str
    name: str
    description: str = ""
    category: str | None = None

    def document(self, tools: Sequence[str] = ()) -> str:
        """Text an encoder reads: name and description first; ``tools`` (names) appended if given."""
        return render_agent(self, tools)


@dataclass(frozen=True)
class Query:
    id: str
    text: str
    tools: tuple[str, ...]  # gold tool ids, once each, in the source's order (call order where known)
    split: str = "test"
    steps: tuple[str, ...] | None = None  # sub-task texts, for step-wise retrieval

    def __post_init__(self) -> None:
        # The gold set is a set: a tool named twice is kept once, here, so that training (gold index
        # tensors) and evaluation (gold id sets) count the same relevant tools. Readers count repeats.
        if isinstance(self.tools, str) or isinstance(self.steps, str):
            raise DataError(f"query {self.id!r}: tools and steps must be sequences of strings, not one string")
        object.__setattr__(self, "tools", tuple(dict.fromkeys(self.tools)))
        if self.steps is not None:
            object.__setattr__(self, "steps", tuple(self.steps))


@dataclass(frozen=True)
class Dependency:
    source: str  # needs ...
    target: str  # ... this tool first
    kind: str | None = None


@dataclass
class ToolDataset:
    name: str
    tools: list[Tool]
    queries: list[Query]
    agents: list[Agent] = field(default_factory=list)
    dependencies: list[Dependency] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)  # reason -> count, what was left out on purpose
    notes: dict[str, Any] = field(default_factory=dict)  # provenance: files read, options

    def __post_init__(self) -> None:
        self.validate()

    # ---- validation -------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise DataError on anything that would silently corrupt training or evaluation."""
        ids: set[str] = set()
        for i, t in enumerate(self.tools):
            where = f"{self.name}: tool #{i} ({t.id!r})"
            if not isinstance(t.id, str) or not t.id:
                raise DataError(f"{where}: empty or non-string id")
            if t.id in ids:
                raise DataError(f"{where}: duplicate tool id {t.id!r}")
            ids.add(t.id)
            if not t.name.strip():
                raise DataError(f"{where}: empty name")
        agent_ids: set[str] = set()
        for a in self.agents:
            if a.id in agent_ids:
                raise DataError(f"{self.name}: duplicate agent id {a.id!r}")
            agent_ids.add(a.id)
        if agent_ids:
            for t in self.tools:
                if t.agent is not None and t.agent not in agent_ids:
                    raise DataError(f"{self.name}: tool {t.id!r} names unknown agent {t.agent!r}")
        qids: set[str] = set()
        for q in self.queries:
            where = f"{self.name}: query {q.id!r}"
            if q.id in qids:
                raise DataError(f"{where}: duplicate query id")
            qids.add(q.id)
            if not q.text.strip():
                raise DataError(f"{where}: empty text")
            if q.split not in SPLITS:
                raise DataError(f"{where}: split {q.split!r} not in {SPLITS}")
            if not q.tools:
                raise DataError(f"{where}: no gold tools")
            for tid in q.tools:
                if tid not in ids:
                    raise DataError(f"{where}: unknown tool {tid!r}")
        for d in self.dependencies:
            for end in (d.source, d.target):
                if end not in ids:
                    raise DataError(f"{self.name}: dependency {d.source!r}->{d.target!r}: unknown tool {end!r}")

    # ---- views --------------------------------------------------------------------------------
    def split(self, name: str) -> list[Query]:
        if name not in SPLITS:
            raise DataError(f"{self.name}: unknown split {name!r}; expected one of {SPLITS}")
        return [q for q in self.queries if q.split == name]

    def tool_by_id(self) -> dict[str, Tool]:
        return {t.id: t for t in self.tools}

    def agent_of(self) -> dict[str, str]:
        """tool id -> agent id, for tools that have an owner."""
        return {t.id: t.agent for t in self.tools if t.agent is not None}

    def stats(self) -> dict[str, Any]:
        per_split = Counter(q.split for q in self.queries)
        labels = [len(q.tools) for q in self.queries]
        return {
            "name": self.name,
            "tools": len(self.tools),
            "agents": len(self.agents),
            "queries": {s: per_split.get(s, 0) for s in SPLITS},
            "labels_per_query": round(sum(labels) / len(labels), 4) if labels else 0.0,
            "max_labels_per_query": max(labels, default=0),
            "dependencies": len(self.dependencies),
            "skipped": dict(sorted(self.skipped.items())),
        }


def render_tool(tool: Tool, style: str = "default") -> str:
    """Render a tool as encoder input.

    ``default``: ``name: description`` then owner, category and parameter names — the fields
    that matter most come first, so a 128-token truncation still sees them.
    ``name_desc``: only ``name: description``.
    ``io``: ``default`` plus the names of what the tool returns — what a dependency is made of
    (b's output feeds a's input), for the dependency discriminator and graph construction.
    ``toolbench``: the ``category_name:…, tool_name:…, api_name:…`` string of ToolBench/ToolLens
    corpora (reproduces ToolLens' corpus.jsonl text exactly).
    """
    head = ": ".join(x for x in (tool.name.strip(), tool.description.strip()) if x)
    if style == "name_desc":
        return head
    if style in ("default", "io"):
        parts = [head]
        if tool.agent:  # a mixture's agent id is dataset::owner: the text shows the owner only
            parts.append(f"from {tool.agent.rsplit(MIXTURE_SEP, 1)[-1]}")
        if tool.category:
            parts.append(f"category {tool.category}")
        names = param_names(tool.parameters)
        if names:
            parts.append("parameters: " + ", ".join(names))
        outputs = param_names(tool.returns) if style == "io" else []
        if outputs:
            parts.append("returns: " + ", ".join(outputs))
        return ". ".join(p.rstrip(" .") for p in parts if p.rstrip(" ."))
    if style == "toolbench":
        params = tool.parameters if isinstance(tool.parameters, dict) else {}
        return (
            f"category_name:{tool.category or ''}, tool_name:{tool.agent or ''}, "
            f"api_name:{tool.name}, api_description:{tool.description}, "
            f"required_params: {json.dumps(params.get('required', []))}, "
            f"optional_params: {json.dumps(params.get('optional', []))}, "
            f"return_schema: {json.dumps(tool.returns if tool.returns is not None else {})}"
        )
    raise DataError(f"unknown tool text style {style!r}; expected default, io, name_desc or toolbench")


def render_agent(agent: Agent, tools: Sequence[str] = ()) -> str:
    """``name: description. category C. tools: a, b, c`` (empty parts left out)."""
    parts = [f"{agent.name}: {agent.description}".strip().rstrip(":")]
    if agent.category:
        parts.append(f"category {agent.category}")
    if tools:
        parts.append("tools: " + ", ".join(tools))
    return ". ".join(p.rstrip(" .") for p in parts if p.rstrip(" ."))


def param_names(parameters: Any) -> list[str]:
    """Parameter names from the common schema shapes (JSON-schema object, list of dicts, dict)."""
    if not parameters:
        return []
    if isinstance(parameters, dict):
        if isinstance(parameters.get("properties"), dict):
            return list(parameters["properties"])
        names: list[str] = []
        for key in ("required", "optional"):
            if isinstance(parameters.get(key), list):
                names += [p["name"] for p in parameters[key] if isinstance(p, dict) and "name" in p]
        return names or [k for k in parameters if isinstance(k, str)]
    if isinstance(parameters, list):
        return [p["name"] for p in parameters if isinstance(p, dict) and "name" in p]
    return []


def param_fields(parameters: Any) -> list[tuple[str, str]]:
    """(name, description) of each field, in ``param_names`` order; ``""`` where none is given."""
    found: dict[str, str] = {}
    if isinstance(parameters, dict):
        props = parameters.get("properties") if isinstance(parameters.get("properties"), dict) else parameters
        found = {k: v.get("description", "") for k, v in props.items() if isinstance(v, dict)}
        for key in ("required", "optional"):
            listed = parameters.get(key)
            for p in listed if isinstance(listed, list) else []:
                if isinstance(p, dict) and "name" in p:
                    found[p["name"]] = p.get("description", "")
    elif isinstance(parameters, list):
        found = {p["name"]: p.get("description", "") for p in parameters if isinstance(p, dict) and "name" in p}
    return [(n, str(found.get(n) or "")) for n in param_names(parameters)]
