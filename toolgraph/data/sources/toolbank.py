"""ToolBank tool catalogs (Moon et al., "Efficient and Scalable Estimation of Tool Representations in
Robust Tool Retrieval" (Tool2Vec), arXiv 2409.02141, 2024; github.com/SqueezeAILab/Tool2Vec,
``toolrag/data_generation/bank_{numpy,pandas,aws}``).

Only the function-description files are public on GitHub; ToolBank's queries live on the HF hub
and are not in the snapshot, so these datasets are catalogs with zero queries.

Each file is one JSON object: original qualified name (``numpy.linalg.norm``) -> {``new_func``,
``description``, ...}. For numpy and pandas, ``new_func`` is ToolBank's *renamed* function (e.g.
``numpy.absolute`` -> ``elemental_magnitude``, so an LLM cannot rely on memorised names); for AWS
it equals the key (``ec2.client.accept_address_transfer``). Tool id = the original name (unique;
12 numpy ``new_func`` names are shared by 2-3 functions, e.g. ``vector_product``), name =
``new_func``, description verbatim (parameters and returns are inside the text except for two
pandas entries with ``parameters``/``returns``/``return`` fields, which are kept). Agent = the owner
the source shows: numpy module (``numpy.linalg``), pandas ``class`` field (45 groups such as
``Series``, ``tseries``, ``main``), AWS service (``ec2``).

A key repeated inside a JSON object would be silently collapsed by the JSON parser (last value
wins), so repeats are detected and counted in ``skipped`` and the first value is kept.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

from toolgraph.data.formats import read_object_counting_repeats, require_fields
from toolgraph.data.schema import Agent, Tool, ToolDataset
from toolgraph.errors import DataError
from toolgraph.registry import DATASETS

_FOLDER = Path("toolbank-tool2vec") / "toolrag" / "data_generation"


def _numpy_owner(key: str, rec: dict) -> str:
    return key.rsplit(".", 1)[0] if "." in key else "numpy"


def _pandas_owner(key: str, rec: dict) -> str | None:
    return rec.get("class") or None


def _aws_owner(key: str, rec: dict) -> str | None:
    return key.split(".", 1)[0] if "." in key else None


def read_toolbank(root: Path, name: str, rel: str, owner: Callable[[str, dict], str | None],
                  agent_kind: str) -> ToolDataset:
    path = root / _FOLDER / rel
    data, repeats = read_object_counting_repeats(path)
    skipped: Counter = Counter()
    skipped["key repeated inside a JSON object (first value kept)"] += repeats
    tools: list[Tool] = []
    agents: dict[str, Agent] = {}
    for key, rec in data.items():
        where = f"function {key!r}"
        require_fields(rec, {"new_func": str, "description": str}, path, what=where)
        if not key.strip() or not rec["new_func"].strip():
            raise DataError(f"{where}: empty function name", path)
        if not rec["description"].strip():
            skipped["function with an empty description"] += 1
            continue
        agent = owner(key, rec)
        if agent:
            agents.setdefault(agent, Agent(agent, agent, agent_kind))
        returns = rec.get("returns", rec.get("return"))
        tools.append(Tool(key, rec["new_func"].strip(), rec["description"].strip(), agent=agent,
                          parameters=rec.get("parameters") or None, returns=returns or None))
    notes = {"files": [str(path)], "queries": "none: ToolBank's queries are on the HF hub, not in the snapshot"}
    return ToolDataset(name, tools, [], list(agents.values()), [], +skipped, notes)


@DATASETS.register("toolbank-numpy")
def load_toolbank_numpy(root: Path) -> ToolDataset:
    """ToolBank numpy: 527 functions (catalog only; the queries are not in the snapshot)."""
    return read_toolbank(root, "toolbank-numpy", "bank_numpy/numpy_function_descriptions.json", _numpy_owner,
                         "numpy module")


@DATASETS.register("toolbank-pandas")
def load_toolbank_pandas(root: Path) -> ToolDataset:
    """ToolBank pandas: 1,655 functions (catalog only)."""
    return read_toolbank(root, "toolbank-pandas", "bank_pandas/pandas_function_descriptions_with_classes.json",
                         _pandas_owner, "pandas class / function group")


@DATASETS.register("toolbank-aws")
def load_toolbank_aws(root: Path) -> ToolDataset:
    """ToolBank AWS: 1,002 boto3 operations (catalog only)."""
    return read_toolbank(root, "toolbank-aws", "bank_aws/aws_function_descriptions.json", _aws_owner,
                         "AWS service (boto3 client)")
