"""Self-supervised training pairs from a catalog's own text: no labelled query needed.

Each kind turns one tool into a (pseudo-query, view of the tool) pair in which the query's text is
*taken out* of the tool's view, so the pair cannot be matched by copying:

- ``ict`` (inverse cloze, Lee et al., ACL 2019): one sentence of the description is the query; the
  tool keeps its name, parameters and the rest of the description. A one-sentence description is
  the query whole, and the view is the name and parameters (name <-> description).
- ``name``: the name in words (``get_weatherForecast`` -> ``get weather forecast``) is the query; the
  view is the tool with its name replaced by the word ``tool`` (a tool needs a name).
- ``params``: the parameters' names and descriptions are the query; the view is the tool without
  parameters.

A tool whose text gives no pair of a kind (a description under four words, a one-word name, fewer
than two parameters) is left out of that kind. Pairs are drawn with a seeded generator.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

from toolgraph.data.schema import Tool, param_fields

KINDS = ("ict", "name", "params")
MIN_WORDS = 4
ANONYMOUS = "tool"  # the name of a view whose name became the query

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\"'])")


def sentences(text: str) -> list[str]:
    """The sentences of a description (a split after ``.``, ``!`` or ``?`` before a capital or digit)."""
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()]


def name_words(name: str) -> str:
    """A tool name as words: ``numpy.linalg.get_normValue`` -> ``numpy linalg get norm value``."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name)
    return " ".join(re.sub(r"[^0-9A-Za-z]+", " ", spaced).lower().split())


def pair(tool: Tool, kind: str, rng: random.Random) -> tuple[str, Tool] | None:
    """(query text, the tool's view) of one kind for one tool, or None when its text gives none."""
    if kind == "ict":
        parts = sentences(tool.description)
        if len(tool.description.split()) < MIN_WORDS:
            return None
        if len(parts) == 1:
            return parts[0], replace(tool, description="")
        long_enough = [i for i, s in enumerate(parts) if len(s.split()) >= MIN_WORDS] or list(range(len(parts)))
        i = rng.choice(long_enough)
        return parts[i], replace(tool, description=" ".join(parts[:i] + parts[i + 1:]))
    if kind == "name":
        words = name_words(tool.name)
        if len(words.split()) < 2 or not tool.description.strip():
            return None
        return words, replace(tool, name=ANONYMOUS)
    if kind == "params":
        fields = param_fields(tool.parameters)
        if len(fields) < 2:
            return None
        text = "; ".join(f"{name_words(n)}: {d}" if d else name_words(n) for n, d in fields)
        return text, replace(tool, parameters=None)
    raise ValueError(f"unknown pseudo-query kind {kind!r}; expected one of {', '.join(KINDS)}")


def pairs(tools: list[Tool], kind: str, max_tools: int | None, seed: int) -> list[tuple[str, Tool]]:
    """The pairs of one kind over a catalog: at most ``max_tools`` of its tools (a seeded sample, in
    catalog order), each tool once."""
    rng = random.Random(f"{seed}:{kind}")
    found = [p for p in (pair(t, kind, rng) for t in tools) if p is not None]
    if max_tools is not None and len(found) > max_tools:
        keep = sorted(rng.sample(range(len(found)), max_tools))
        found = [found[i] for i in keep]
    return found
