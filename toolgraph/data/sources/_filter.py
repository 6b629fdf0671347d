"""The query filter the adapters share: which source records become queries, and what is counted
in ``ToolDataset.skipped`` when one does not.

Each adapter names its skip reasons once (a :class:`SkipReasons`, in its own words: "query",
"task", "request", "dialogue") and runs its records through a :class:`QueryFilter`, in the order
it needs:

* ``repeated(key)`` / ``keep(key)``: de-duplication by id or text (first kept);
* ``reject(text, tools, known)``: blank text, no tools, a tool missing from the catalog, checked in
  that order, the first failing check counted;
* ``gold(names)``: the tools once each, in source order, repeats counted;
* ``resolve(ids)``: the same for tools resolved one by one, where an unresolved one (None) is dropped
  and counted and the query survives if any tool is left (``empty`` then rejects it otherwise).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SkipReasons:
    """The ``skipped`` key of each check; a check whose reason is None is never run by ``reject``."""

    empty_text: str | None = None
    no_tools: str | None = None
    unknown_tool: str | None = None
    repeated_tool: str | None = None  # a tool named again in one query's gold list
    dropped_tool: str | None = None  # ``resolve``: a tool that did not resolve (dropped, query kept)
    repeated_query: str | None = None


class QueryFilter:
    """Counts every record it turns away in ``skipped`` under the adapter's :class:`SkipReasons`."""

    def __init__(self, reasons: SkipReasons, skipped: Counter) -> None:
        self.reasons = reasons
        self.skipped = skipped
        self._seen: set[Hashable] = set()

    def _skip(self, reason: str | None) -> bool:
        if reason is None:
            raise ValueError("QueryFilter: this adapter names no reason for that check")
        self.skipped[reason] += 1
        return True

    # ---- de-duplication -----------------------------------------------------------------------
    def repeated(self, key: Hashable) -> bool:
        """True (counted) when a query with ``key`` was already kept."""
        return key in self._seen and self._skip(self.reasons.repeated_query)

    def keep(self, key: Hashable) -> None:
        self._seen.add(key)

    # ---- checks -----------------------------------------------------------------------------
    def blank(self, text: str) -> bool:
        return not text.strip() and self._skip(self.reasons.empty_text)

    def empty(self, tools: Sequence[str]) -> bool:
        return not tools and self._skip(self.reasons.no_tools)

    def unknown(self, tools: Iterable[str], known: Collection[str]) -> bool:
        return any(t not in known for t in tools) and self._skip(self.reasons.unknown_tool)

    def reject(self, text: str, tools: Sequence[str], known: Collection[str]) -> bool:
        """Blank text, then no tools (when the adapter names that reason), then an unknown tool."""
        return (self.blank(text) or (self.reasons.no_tools is not None and self.empty(tools))
                or self.unknown(tools, known))

    # ---- gold lists -------------------------------------------------------------------------
    def gold(self, names: Sequence[str]) -> tuple[str, ...]:
        """``names`` once each, first-seen order; the repeats are counted (the key is set even at 0)."""
        if self.reasons.repeated_tool is None:
            raise ValueError("QueryFilter: this adapter names no reason for repeated tools")
        gold = tuple(dict.fromkeys(names))
        self.skipped[self.reasons.repeated_tool] += len(names) - len(gold)
        return gold

    def resolve(self, ids: Iterable[str | None]) -> tuple[str, ...]:
        """Resolved ids once each, in order; each None (unresolved) and each repeat counted as met."""
        out: list[str] = []
        for tid in ids:
            if tid is None:
                self._skip(self.reasons.dropped_tool)
            elif tid in out:
                self._skip(self.reasons.repeated_tool)
            else:
                out.append(tid)
        return tuple(out)
