"""The Retriever protocol: every method, trained or not, ranks tools the same way.

    r.index(tools); ranking = r.retrieve(["book a flight"], k=5)
    r.add_tools(new); r.remove_tools(["id"]); r.save(dir); Retriever.load(dir)

Tools are kept sorted by id (natural order: "2" < "10"), so equal scores are broken by tool id.
Subclasses implement ``score(queries) -> [Q, N]`` over ``self.tools`` and ``_build()``; methods
that search an index themselves (FAISS) override ``_search``.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from toolgraph.config import ToolText, check_values, from_dict, to_saved
from toolgraph.data.formats import gc_paused, iter_jsonl, read_json
from toolgraph.data.schema import Tool, ToolDataset, natural_key
from toolgraph.errors import ConfigError, DataError
from toolgraph.registry import RETRIEVERS
from toolgraph.retrieval.manifest import MANIFEST, check_manifest, mark_writing, write_manifest
from toolgraph.retrieval.progress import batches
from toolgraph.retrieval.steps import merged_scores
from toolgraph.retrieval.topk import topk

__all__ = ["Ranking", "Retriever", "RetrieverConfig", "natural_key"]

# folders whose whole tree this load has checked against their manifest: members loaded from
# inside them (a pipeline's first_stage/, an index's dense/) are not hashed a second time
_VERIFIED: ContextVar[tuple[Path, ...]] = ContextVar("toolgraph_verified_folders", default=())


@dataclass
class RetrieverConfig:
    name: str = ""
    tool_text: ToolText = "default"  # see data.schema.render_tool


@dataclass
class Ranking:
    """Top-k per query: ``ids[q]`` best first, ``scores[q, i]`` the score of ``ids[q][i]``."""

    ids: list[list[str]]
    scores: torch.Tensor  # [Q, k]
    extra: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class Hit:
    """One tool found for a request (``Retriever.search``): its rank (1 = best), score as a plain float
    (on the retriever's own scale: cosine for dense encoders, BM25's for BM25) and the tool itself."""

    rank: int
    score: float
    tool: Tool

    @property
    def id(self) -> str:
        return self.tool.id

    @property
    def name(self) -> str:
        return self.tool.name

    def __str__(self) -> str:
        owner = f" [{self.tool.agent}]" if self.tool.agent else ""
        return f"{self.rank}. {self.score:.4f}  {self.tool.id}  {self.tool.name}{owner}"


class Retriever(ABC):
    Config: ClassVar[type] = RetrieverConfig
    name: ClassVar[str] = ""

    @classmethod
    def parse_config(cls, values: dict, where: str = "saved retriever config") -> Any:
        """This class's typed config from a plain dict (retriever.json, an inline spec), checked by its
        schema. To get a Retriever from a dict, name, path or config, use ``loading.resolve_retriever``."""
        try:
            return from_dict(cls.Config(name=cls.name), values, where)
        except ConfigError as e:
            raise ConfigError(f"{where} does not fit {cls.__name__}: {e}") from None

    def __init__(self, config: Any = None):
        # a config built in code gets the checks load_config applies to a file (choices, ranges)
        self.config = check_values(config, "retriever.") if config is not None else self.Config(name=self.name)
        self.tools: list[Tool] = []

    # ---- protocol ---------------------------------------------------------------------------
    def fit(self, dataset: ToolDataset) -> None:  # noqa: B027 - optional: most retrievers learn nothing here
        """Learn from a dataset's training queries (usage) before ``index``; a no-op by default.
        ``evaluate()`` calls it, so usage-driven methods (Tool2Vec) need no special casing."""

    def index(self, tools: Iterable[Tool]) -> None:
        tools = list(tools)
        ids = [t.id for t in tools]
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise DataError(f"cannot index: duplicate tool id {dup!r}")
        self.tools = sorted(tools, key=lambda t: natural_key(t.id))
        self._build()

    def retrieve(self, queries: Sequence[str], k: int, batch_size: int = 256, progress: bool | str = False) -> Ranking:
        """Top-k tools per query, ``batch_size`` queries at a time; ``progress``: a bar (its label)
        over the queries, with an ETA (``retrieval/progress.py``)."""
        if not self.tools:
            raise RuntimeError(f"{type(self).__name__}: index(tools) before retrieve()")
        ids: list[list[str]] = []
        scores: list[torch.Tensor] = []
        for part in batches(len(queries), batch_size, progress):
            values, indices = self._search(list(queries[part]), k)
            scores.append(values)
            ids += [[self.tools[i].id for i in row] for row in indices.tolist()]
        return Ranking(ids, torch.cat(scores) if scores else torch.zeros(0, k))

    def search(self, query: str, k: int = 5) -> list[Hit]:
        """The ``k`` best tools for one request as :class:`Hit` s (rank, score as a float, the ``Tool``
        with its name and description); ``retrieve`` is the batched form (ids and a score tensor)."""
        if not isinstance(query, str):
            raise TypeError(f"search takes one request (a str), got {type(query).__name__}; "
                            "retrieve takes a list of them")
        ranking = self.retrieve([query], k)
        tools = self._tool_by_id()
        return [Hit(rank, score, tools[i]) for rank, (i, score) in
                enumerate(zip(ranking.ids[0], ranking.scores[0].tolist()), 1)]

    def _tool_by_id(self) -> dict[str, Tool]:
        """id -> Tool of ``self.tools``, built once per tool list (a search over 1M tools looks up k)."""
        cached = getattr(self, "_by_id", None)
        if cached is None or cached[0] is not self.tools or cached[1] != len(self.tools):
            cached = self._by_id = (self.tools, len(self.tools), {t.id: t for t in self.tools})
        return cached[2]

    def retrieve_steps(self, step_lists: Sequence[Sequence[str]], k: int, merge: str = "max",
                       batch_size: int = 256, progress: bool | str = False) -> Ranking:
        """Step-wise querying: each task's steps are scored separately and merged into one ranking
        by ``merge`` (max | interleave | rrf; see retrieval/steps.py)."""
        if not self.tools:
            raise RuntimeError(f"{type(self).__name__}: index(tools) before retrieve_steps()")
        ids: list[list[str]] = []
        scores: list[torch.Tensor] = []
        for part in batches(len(step_lists), batch_size, progress):
            chunk = [list(s) for s in step_lists[part]]
            values, indices = topk(merged_scores(self.score, chunk, merge), k, self.tools)
            scores.append(values)
            ids += [[self.tools[i].id for i in row] for row in indices.tolist()]
        return Ranking(ids, torch.cat(scores) if scores else torch.zeros(0, k))

    def retrieve_agents(self, queries: Sequence[str], k: int, steps: Sequence[Sequence[str]] | None = None,
                        batch_size: int = 256, merge: str | None = None, progress: bool | str = False) -> Ranking:
        """Top-k agents (tool owners) per query: the full tool ranking rolled up, each agent scored by
        its best tool. Agent routers (retrieval/agents.py) rank agents themselves."""
        owner = self._owners()
        n = len(self.tools)
        tools = (self.retrieve(queries, n, batch_size, progress) if steps is None
                 else self.retrieve_steps(steps, n, merge or "max", batch_size, progress))
        return _roll_up(tools, owner, k)

    def retrieve_agents_and_tools(self, queries: Sequence[str], k: int) -> tuple[Ranking, Ranking]:
        """The top-k agents and the whole tool ranking of the same queries, scored once (the server
        lists each agent's best tools from it)."""
        owner = self._owners()
        tools = self.retrieve(queries, len(self.tools))
        return _roll_up(tools, owner, k), tools

    def _owners(self) -> dict[str, str]:
        owner = {t.id: t.agent for t in self.tools if t.agent is not None}
        if not owner:
            raise DataError(f"{type(self).__name__}: no indexed tool names an agent")
        return owner

    def add_tools(self, tools: Iterable[Tool]) -> None:
        new = list(tools)
        clash = {t.id for t in new} & {t.id for t in self.tools}
        if clash:
            raise DataError(f"add_tools: ids already indexed: {sorted(clash)[:5]}")
        self.index(self.tools + new)

    def remove_tools(self, ids: Iterable[str]) -> None:
        drop = set(ids)
        missing = drop - {t.id for t in self.tools}
        if missing:
            raise DataError(f"remove_tools: unknown ids {sorted(missing)[:5]}")
        self.index([t for t in self.tools if t.id not in drop])

    def save(self, folder: str | Path) -> Path:
        """Write the folder ``load`` rebuilds this retriever from; ``manifest.json`` (every file's
        size and sha256, tensor shapes, tool count) is written last and marks the save complete."""
        folder = Path(folder)
        mark_writing(folder)  # an interrupted save is refused on load, never half-loaded
        with (folder / "tools.jsonl").open("w", encoding="utf-8") as f:
            for t in self.tools:
                f.write(json.dumps(t.to_dict(), ensure_ascii=False) + "\n")
        self._save_state(folder)
        meta = {"retriever": self.name, "config": to_saved(self.config), "tools": len(self.tools)}
        (folder / "retriever.json").write_text(json.dumps(meta, indent=2) + "\n")  # the last two files:
        write_manifest(folder, self.name, len(self.tools))  # a watcher of either sees a finished save
        return folder

    @staticmethod
    def load(folder: str | Path) -> Retriever:
        """Rebuild any saved retriever from its folder alone (it describes itself). The folder is
        first checked against its ``manifest.json`` (once, sub-folders included); a damaged or
        mixed folder is a DataError naming the file."""
        folder = Path(folder)
        meta_path = folder / "retriever.json"
        if not meta_path.is_file():
            raise DataError("not a saved retriever (retriever.json missing)", folder)
        here = folder.resolve()
        verified = _VERIFIED.get()
        inside = any(here == root or root in here.parents for root in verified)
        manifest = None if inside else check_manifest(folder)
        token = _VERIFIED.set(verified + (here,)) if manifest is not None else None
        try:
            return Retriever._load_checked(folder, manifest)
        finally:
            if token is not None:
                _VERIFIED.reset(token)

    @staticmethod
    def _load_checked(folder: Path, manifest: dict | None) -> Retriever:
        meta_path = folder / "retriever.json"
        meta = read_json(meta_path)
        if not isinstance(meta, dict) or not isinstance(meta.get("retriever"), str) \
                or not isinstance(meta.get("config"), dict):
            raise DataError("expected {\"retriever\": <name>, \"config\": {...}, \"tools\": <count>}; the "
                            "folder is damaged: re-save the retriever", meta_path)
        try:
            cls = RETRIEVERS.get(meta["retriever"])
        except ConfigError as e:
            raise ConfigError(f"{meta_path}: retriever: {e}") from None
        config = cls.parse_config(meta["config"], f"{meta_path}: config")
        r = cls(config)
        r.tools = r._read_tools(folder)
        for source, count in (("retriever.json", meta.get("tools")),
                              (MANIFEST, manifest.get("tools") if manifest else None)):
            if count is not None and count != len(r.tools):
                raise DataError(f"{len(r.tools)} tools, but {source} says {count}: the folder mixes files of "
                                "two saves or was cut short; re-save the retriever", folder / "tools.jsonl")
        r._load_state(folder)
        return r

    # ---- hooks ------------------------------------------------------------------------------
    def _read_tools(self, folder: Path) -> list[Tool]:
        """The saved tools of ``folder`` (before ``_load_state``); a dense index adds its delta's."""
        return read_saved_tools(folder / "tools.jsonl")

    def _build(self) -> None:  # noqa: B027 - optional hook: retrievers that score on the fly have no index
        """(Re)build the index over ``self.tools``."""

    @abstractmethod
    def score(self, queries: list[str]) -> torch.Tensor:
        """[Q, N] scores over ``self.tools``."""

    def _search(self, queries: list[str], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return topk(self.score(queries), k, self.tools)  # a NaN / inf score is an error, not rank 1

    def _save_state(self, folder: Path) -> None:  # noqa: B027 - optional hook: most state is the config
        """Write what ``_load_state`` needs beyond the config and the tools."""

    def _load_state(self, folder: Path) -> None:
        self._build()

    def documents(self, tools: Sequence[Tool] | None = None) -> list[str]:
        return [t.document(self.config.tool_text) for t in (self.tools if tools is None else tools)]


def read_saved_tools(path: Path) -> list[Tool]:
    """The tools of a saved retriever's ``tools.jsonl``; a bad line is a DataError naming file:line."""
    tools: list[Tool] = []
    seen: dict[str, int] = {}
    with gc_paused() as paused:  # a million records: no ever longer full collections while they are made
        for lineno, obj in iter_jsonl(path):
            try:
                tool = Tool(**obj) if isinstance(obj, dict) else None
            except TypeError as e:
                raise DataError(f"not a tool record ({e}); re-save the retriever", path, lineno) from None
            if tool is None or not isinstance(tool.id, str):
                raise DataError("not a tool record (expected an object with id, name, description); re-save the "
                                "retriever", path, lineno)
            if tool.id in seen:
                raise DataError(f"duplicate tool id {tool.id!r} (first on line {seen[tool.id]})", path, lineno)
            seen[tool.id] = lineno
            tools.append(tool)
        paused.freeze(len(tools))
    return tools


def _roll_up(tools: Ranking, owner: dict[str, str], k: int) -> Ranking:
    """Tool ranking -> the top-k agents, in order of their best tool, scored by it."""
    ids, scores = [], torch.full((len(tools.ids), k), float("-inf"))
    for q, (row, values) in enumerate(zip(tools.ids, tools.scores.tolist())):
        best: dict[str, float] = {}
        for t, v in zip(row, values):
            a = owner.get(t)
            if a is not None and a not in best:
                best[a] = v
                if len(best) == k:
                    break
        ids.append(list(best))
        scores[q, : len(best)] = torch.tensor(list(best.values()))
    return Ranking(ids, scores)
