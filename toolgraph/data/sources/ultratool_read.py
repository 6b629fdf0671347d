"""Readers for GNN4TaskPlan's UltraTool files (see ``ultratool.py`` for the choices): ``tool_desc.json``,
``data.json``, ``split_ids.json``, ``user_requests.json`` and ``graph_desc.json``. Each checks its records;
errors name the file, and the line for the JSONL ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolgraph.data.formats import iter_jsonl, read_json, require_fields
from toolgraph.errors import DataError


@dataclass(frozen=True)
class Request:
    """One ``data.json`` record, checked."""

    id: str
    text: str  # user_request, stripped
    names: list[str]  # the task_nodes' tools, in order
    links: list[tuple[str, str]]  # task_links as (source, target): source runs before target


def read_tools(path: Path) -> list[dict]:
    """``tool_desc.json``: the ``nodes`` list (each with an ``id`` and a ``desc``)."""
    obj = read_json(path)
    if not isinstance(obj, dict) or not isinstance(obj.get("nodes"), list):
        raise DataError("expected an object with a 'nodes' list", path)
    for i, node in enumerate(obj["nodes"]):
        if not isinstance(node, dict) or not isinstance(node.get("id"), str) or not node["id"].strip():
            raise DataError(f"node {i}: missing or empty 'id'", path)
        if not isinstance(node.get("desc"), str):
            raise DataError(f"node {i} ({node['id']!r}): missing 'desc'", path)
    return obj["nodes"]


def read_links(path: Path) -> list[tuple[str, str]]:
    """``graph_desc.json``: the ``links`` as (source, target)."""
    obj = read_json(path)
    if not isinstance(obj, dict) or not isinstance(obj.get("links"), list):
        raise DataError("expected an object with a 'links' list", path)
    out = []
    for i, link in enumerate(obj["links"]):
        if not isinstance(link, dict) or not all(isinstance(link.get(k), str) for k in ("source", "target")):
            raise DataError(f"link {i}: missing 'source' or 'target'", path)
        out.append((link["source"], link["target"]))
    return out


def read_test_ids(path: Path) -> set[str]:
    """``split_ids.json``: the ids listed under ``test_ids``."""
    obj = read_json(path)
    if not isinstance(obj, dict) or not isinstance(obj.get("test_ids"), dict):
        raise DataError("expected an object with a 'test_ids' mapping", path)
    return {str(i) for ids in obj["test_ids"].values() for i in ids}


def read_requests(path: Path) -> list[Request]:
    """``data.json`` (JSONL): every record, checked; a repeated id is an error."""
    out: list[Request] = []
    seen: set[str] = set()
    for lineno, obj in iter_jsonl(path):
        fields = {"id": str, "user_request": str, "task_nodes": list, "task_links": list}
        require_fields(obj, fields, path, lineno, "record")
        for node in obj["task_nodes"]:
            require_fields(node, {"task": str}, path, lineno, "task node")
        for link in obj["task_links"]:
            require_fields(link, {"source": str, "target": str}, path, lineno, "task link")
        if obj["id"] in seen:
            raise DataError(f"duplicate id {obj['id']!r}", path, lineno)
        seen.add(obj["id"])
        out.append(Request(obj["id"], obj["user_request"].strip(), [n["task"] for n in obj["task_nodes"]],
                           [(link["source"], link["target"]) for link in obj["task_links"]]))
    return out


def read_request_ids(path: Path) -> list[str]:
    """``user_requests.json`` (JSONL): the id of each request."""
    out = []
    for lineno, obj in iter_jsonl(path):
        require_fields(obj, {"id": str}, path, lineno, "request")
        out.append(obj["id"])
    return out
