"""A request split into the pieces that may each need a tool, and training pieces labelled with their tool.

``sentences`` and ``clauses`` split a request (``retriever.query_split`` scores each piece on its own,
toolgraph/retrieval/steps.py). :func:`labelled_pieces` turns a training query that needs several tools
into one training query per piece, each with the one gold tool it names: a retriever that scores
pieces at inference then trains on pieces too (``data.options.query_pieces`` of the ``mixture`` dataset).

Which gold tool a piece names is read from the words it shares with each gold tool's name and
description (a piece of "Book a table for two. Then order a taxi to the restaurant" shares "taxi"
with the taxi tool, none with the restaurant one). A piece that shares no word with any gold tool, or
as many with two, names none and is left out: a wrong label teaches more than a missing one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from toolgraph.data.schema import Query, Tool

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
# a clause boundary: a sentence end (also ";"), or a connective that starts the next request
_CLAUSE_END = re.compile(r",?\s+(?:and then|then|also|as well as|additionally|and also)\s+|(?<=[.!?;])\s+(?=\S)",
                         re.IGNORECASE)
MIN_CLAUSE_WORDS = 3  # shorter pieces ("Thanks.", "Also") are dropped: they name no tool


def sentences(text: str) -> list[str]:
    """Split a request at sentence ends (., !, ? followed by space); empty pieces dropped."""
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()] or [text]


def clauses(text: str) -> list[str]:
    """Split a request into the clauses that may each need a tool: at sentence ends and ``;``, and
    before ``then``, ``also``, ``additionally``, ``as well as``, ``and then``, ``and also``. Pieces
    of fewer than :data:`MIN_CLAUSE_WORDS` words are dropped; fewer than two left: the whole request."""
    pieces = [p.strip(" ,.;") for p in _CLAUSE_END.split(text.strip())]
    kept = [p for p in pieces if len(p.split()) >= MIN_CLAUSE_WORDS]
    return kept if len(kept) > 1 else [text]


# retriever.query_split: how a retriever splits a request before scoring it (none: it does not);
# the keys are config.QuerySplit's values (a test holds them equal)
SPLITS = {"none": lambda text: [text], "sentences": sentences, "clauses": clauses}

# words that name no tool: they never decide which tool a piece names
_STOP = frozenset("""a an the and or of to for in on at by with from is are be am was were me my i you your
we our us it its this that these those please can could would will want need get make then also as well
after before into about some any all do does help like just now using use""".split())
_STEM = 6  # words compare on their first 6 letters ("forecasting" / "forecast"; "tables" / "table" do not)


def words(text: str) -> frozenset[str]:
    """The content words of ``text``: camelCase and snake_case split, lower case, stop words and words
    shorter than 3 letters dropped, each cut to its first :data:`_STEM` letters."""
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)
    return frozenset(w[:_STEM] for w in re.findall(r"[a-z0-9]+", spaced.lower()) if len(w) > 2 and w not in _STOP)


def named_tool(piece: str, gold: dict[str, frozenset[str]]) -> str | None:
    """The gold tool id whose words (``gold``: id -> :func:`words` of its name and description) ``piece``
    shares most, by shared words / sqrt(the tool's words) (a long description does not win by length);
    None when it shares none or two tools tie."""
    mine = words(piece)
    scored = sorted(((len(mine & ws) / math.sqrt(len(ws)), t) for t, ws in gold.items() if ws), reverse=True)
    if not scored or scored[0][0] == 0 or (len(scored) > 1 and scored[0][0] == scored[1][0]):
        return None
    return scored[0][1]


def labelled_pieces(queries: Iterable[Query], tools: dict[str, Tool], rule: str = "clauses") -> list[Query]:
    """Training pieces of every training query with at least two gold tools that ``rule`` (a key of
    :data:`SPLITS`) splits into at least two pieces: one query per piece that names a gold tool
    (:func:`named_tool`), id ``<query id>#piece<i>``, that tool its only gold tool, split ``train``."""
    if rule not in SPLITS or rule == "none":
        raise ValueError(f"query pieces split by one of {[s for s in SPLITS if s != 'none']}, got {rule!r}")
    out: list[Query] = []
    for q in queries:
        if q.split != "train" or len(q.tools) < 2:
            continue
        pieces = SPLITS[rule](q.text)
        if len(pieces) < 2:
            continue
        gold = {t: words(f"{tools[t].name} {tools[t].description}") for t in q.tools if t in tools}
        for i, piece in enumerate(pieces):
            tool = named_tool(piece, gold)
            if tool is not None:
                out.append(Query(f"{q.id}#piece{i}", piece, (tool,), "train"))
    return out
