"""Catalogs of 1k to 1M tools for scale benchmarks, built from the real tools of every dataset.

    tools, needle = scale_catalog(100_000)   # ToolLens' tools and test queries inside 100k tools

The catalog of size n is the needle dataset's tools (ToolLens: 464, whose test queries carry the
labels), then distractors in one fixed order, cut at n; so every smaller catalog is a prefix of a
larger one and the vectors of a 1M build cover every rung.

Distractors, in order:

1. **Real tools** of every registered dataset (ToolBench, ToolBank, Seal-Tools, NesTools, API-Bank,
   Gorilla, MetaTool, UltraTool, ToolLinkOS, TDI links, ...; ~16k distinct documents), each once,
   id ``real/<dataset>/<id>``, in a seeded shuffle. A tool whose document (``render_tool``) equals
   another's, or a needle tool's, is left out; the needle dataset's own tools are never distractors.
2. **Recombinations** ``mix/<j>``: the name and description of real tool *a*, listed under another
   real tool *b*'s server (``agent``) and category, with the parameter schema of *c*, a sibling of *a*
   (a tool of the same dataset). Triples come from one seeded stream; a triple whose document was
   seen before is drawn again, so every id and every document text is distinct. A description thus
   appears under up to ~60 servers at 1M: the pool is denser in near-duplicates than a real registry,
   which makes the needle test harder, not easier.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Iterator
from dataclasses import replace

from toolgraph.data.loading import load_dataset
from toolgraph.data.schema import Tool, ToolDataset
from toolgraph.errors import ConfigError
from toolgraph.registry import DATASETS

# catalogs of several datasets in one (mixture), a generic reader (beir, mcp), a translation of another
# dataset's tools (ultratool-original-zh) and views of another catalog's tools (catalog-pairs) are not
# sources of their own
NOT_SOURCES = ("beir", "catalog-pairs", "mcp", "mixture", "ultratool-original-zh")


def _key(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=12).digest()


def source_names(needle: str) -> list[str]:
    """The registered datasets whose tools become distractors: all but ``needle`` and NOT_SOURCES."""
    return sorted(n for n in DATASETS.names() if n not in NOT_SOURCES and n != needle)


def real_distractors(datasets: Iterable[ToolDataset], exclude: Iterable[str] = ()) -> list[Tool]:
    """Each distinct tool document of ``datasets`` once (first seen wins, datasets in the order given),
    id ``real/<dataset>/<id>``; a document in ``exclude`` (the needle's) is left out."""
    seen = {_key(d) for d in exclude}
    out: list[Tool] = []
    for ds in datasets:
        for t in ds.tools:
            k = _key(t.document())
            if k in seen:
                continue
            seen.add(k)
            out.append(replace(t, id=f"real/{ds.name}/{t.id}"))
    return out


def recombinations(real: list[Tool], seen: set[bytes], seed: int = 0) -> Iterator[Tool]:
    """Endless distinct ``mix/<j>`` tools from ``real`` (see the module doc); ``seen``: the document
    keys already in the catalog, extended as tools are made."""
    if len(real) < 2:
        raise ConfigError("scale_catalog: recombination needs at least two real distractor tools")
    rng = random.Random(seed)
    siblings: dict[str, list[Tool]] = {}
    for t in real:
        siblings.setdefault(t.id.split("/")[1], []).append(t)
    j, misses = 0, 0
    while True:
        a, b = real[rng.randrange(len(real))], real[rng.randrange(len(real))]
        family = siblings[a.id.split("/")[1]]
        c = family[rng.randrange(len(family))]
        tool = Tool(id=f"mix/{j}", name=a.name, description=a.description, agent=b.agent or b.name,
                    category=b.category, parameters=c.parameters)
        k = _key(tool.document())
        if k in seen:
            misses += 1
            if misses > 10_000:
                raise ConfigError("scale_catalog: 10,000 recombinations in a row repeated a document; the real "
                                  "pool is too small for this size")
            continue
        seen.add(k)
        misses = 0
        j += 1
        yield tool


def scale_catalog(n: int, root=None, needle: str = "toollens", seed: int = 0,
                  sources: list[str] | None = None) -> tuple[list[Tool], ToolDataset]:
    """(the first ``n`` tools of the scale catalog, the needle dataset). ``n`` must hold the needle's
    tools; ``sources``: the datasets of the real distractors (default: :func:`source_names`)."""
    target = load_dataset(needle, root)
    if n < len(target.tools):
        raise ConfigError(f"scale_catalog: n={n} is smaller than the needle catalog ({needle}: "
                          f"{len(target.tools)} tools)")
    needle_docs = [t.document() for t in target.tools]
    datasets = [load_dataset(name, root) for name in (sources if sources is not None else source_names(needle))]
    real = real_distractors(datasets, needle_docs)
    random.Random(seed).shuffle(real)
    tools = list(target.tools) + real[: n - len(target.tools)]
    if len(tools) < n:
        seen = {_key(d) for d in needle_docs} | {_key(t.document()) for t in real}
        stream = recombinations(real, seen, seed)
        tools += [next(stream) for _ in range(n - len(tools))]
    return tools, target
