"""Model cards: the README.md of an exported retriever folder, in the Hugging Face model-card format.

YAML front matter (``license``, ``library_name``, ``tags``, ``base_model``, ``datasets`` and a
``model-index`` with the test metrics), then what the retriever is, how to load it, its metrics (read
from the run's results.json: the numbers are the ones the run measured), training (steps, seconds,
device, the whole config), intended use and limits. So an exported folder can be pushed to a model hub
as it is, and says by itself what it was trained on and how well it does. An exported
``encoder/`` (a sentence-transformers folder) gets the same card with a sentence-transformers snippet.

``base_model`` follows warm starts: an encoder that is a folder exported by an earlier toolgraph run
(``<run>/retriever/encoder``) leads to that run's ``model.encoder``, down to a named model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from toolgraph.files import write_text_atomic

__all__ = ["base_models", "render_card", "write_cards"]

# named encoders toolgraph resolves offline: hub id and license of the weights
KNOWN_BASES = {"all-MiniLM-L6-v2": ("sentence-transformers/all-MiniLM-L6-v2", "apache-2.0")}
METRIC_NAMES = {"recall": "Recall", "ndcg": "NDCG", "pass": "Pass", "mrr": "MRR"}  # the card's metrics
HEADLINE_KS = (1, 3, 5, 10)


def _run_encoder(folder: Path) -> str | None:
    """``model.encoder`` of the run that exported ``folder`` (``<run>/retriever/encoder``), if any."""
    for run in list(folder.resolve().parents)[:3]:
        path = run / "config.yaml"
        if path.is_file():
            try:
                config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            except yaml.YAMLError:
                return None
            model = config.get("model") if isinstance(config, dict) else None
            return _encoder_name(model) if isinstance(model, dict) else None
    return None


def _encoder_name(model: dict) -> str | None:
    """A run config's ``model.encoder``: a TextEncoderSpec dict (``name``), or a name (runs before issue 42)."""
    encoder = model.get("encoder")
    return encoder.get("name") if isinstance(encoder, dict) else encoder


def _prefixes(model: dict) -> tuple[str | None, str | None]:
    """(query prefix, tool document prefix) of a run config's ``model`` section, new keys or old."""
    encoder = model.get("encoder")
    if isinstance(encoder, dict):
        return encoder.get("query_prefix"), encoder.get("doc_prefix")
    return model.get("query_prefix"), model.get("tool_prefix")


def base_models(encoder: str | None, depth: int = 6) -> list[str]:
    """The chain of encoders a model started from, the given one first and a named model last
    (``KNOWN_BASES`` names map to their hub ids); stops at a folder no toolgraph run exported."""
    chain: list[str] = []
    while encoder and len(chain) < depth and encoder not in chain:
        chain.append(encoder)
        if encoder in KNOWN_BASES or not Path(encoder).is_dir():
            break
        encoder = _run_encoder(Path(encoder))
    return chain


def _metric_entries(metrics: dict[str, float]) -> list[dict[str, Any]]:
    out = []
    for key, value in metrics.items():
        name, _, k = key.partition("@")
        if name not in METRIC_NAMES or (k and int(k) not in HEADLINE_KS):
            continue
        label = METRIC_NAMES[name] + (f"@{k}" if k else "")
        out.append({"type": f"{name}_at_{k}" if k else name, "value": round(float(value), 4), "name": label})
    return out


def _front_matter(name: str, method: str, dataset: str, split: str, base: str | None, license_id: str,
                  metrics: dict[str, float]) -> dict[str, Any]:
    meta: dict[str, Any] = {"license": license_id, "library_name": "toolgraph",
                            "tags": ["toolgraph", "tool-retrieval", method]}
    if base:
        meta["base_model"] = base
    meta["datasets"] = [dataset]
    entries = _metric_entries(metrics)
    if entries:
        meta["model-index"] = [{"name": name, "results": [{
            "task": {"type": "tool-retrieval", "name": "Tool retrieval"},
            "dataset": {"name": dataset, "type": dataset, "split": split},
            "metrics": entries}]}]
    return meta


def _table(metrics: dict[str, float]) -> str:
    """One row per metric, one column per k (MRR in the k=1 column's place: it has no k)."""
    ks = [k for k in HEADLINE_KS if any(f"{n}@{k}" in metrics for n in METRIC_NAMES)]
    rows = [n for n in METRIC_NAMES if n != "mrr" and any(f"{n}@{k}" in metrics for k in ks)]
    if not rows:
        return ""
    lines = ["| metric | " + " | ".join(f"@{k}" for k in ks) + " |", "|---|" + "---:|" * len(ks)]
    for n in rows:
        cells = [f"{metrics[f'{n}@{k}']:.4f}" if f"{n}@{k}" in metrics else "" for k in ks]
        lines.append(f"| {METRIC_NAMES[n]} | " + " | ".join(cells) + " |")
    if "mrr" in metrics:
        lines.append(f"| MRR | {metrics['mrr']:.4f} |" + " |" * (len(ks) - 1))
    return "\n".join(lines)


def render_card(results: dict[str, Any], name: str, encoder_folder: bool = False) -> str:
    """The card of a retriever (or, ``encoder_folder``, of its exported sentence-transformers encoder)
    from a results.json-shaped dict: ``config`` (required), ``metrics``, ``dataset``, ``training``."""
    config = results.get("config") or {}
    model, data = config.get("model") or {}, config.get("data") or {}
    method, dataset = model.get("name", "retriever"), data.get("name", "unknown")
    split = data.get("test_split") or data.get("split") or "test"
    chain = base_models(_encoder_name(model))
    named = KNOWN_BASES.get(chain[-1]) if chain else None
    base = named[0] if named else (chain[-1] if chain else None)
    license_id = named[1] if named else "other"
    metrics = results.get("metrics") or {}
    stats, training = results.get("dataset") or {}, results.get("training") or {}
    meta = _front_matter(name, method, dataset, split, base, license_id, metrics)
    if encoder_folder:
        meta["tags"] = [*meta["tags"], "sentence-transformers", "feature-extraction"]
        meta["pipeline_tag"] = "sentence-similarity"
    lines = ["---", yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).rstrip(), "---", "", f"# {name}", ""]
    queries = stats.get("queries") or {}
    size = f" ({stats['tools']} tools, {queries.get('train', '?')} training queries)" if "tools" in stats else ""
    lines += [f"A **{method}** tool retriever trained with toolgraph on **{dataset}**{size}: "
              "given a request, it ranks the catalog's tools so that the few the request needs come first."]
    if chain:
        lines += ["", "Started from: " + " → ".join(f"`{c}`" for c in reversed(chain)) + "."]
    first = model.get("first_stage")
    first = first.get("source") if isinstance(first, dict) else first
    if first:
        lines += ["", f"It reranks the candidates of a first stage: `{first}` (saved in this folder)."]
    lines += ["", "## Use", ""]
    prompts = {k: v for k, v in zip(("query", "document"), _prefixes(model), strict=True) if v}
    if encoder_folder:
        kw = ', prompt_name="query"' if "query" in prompts else ""
        lines += ["```python", "from sentence_transformers import SentenceTransformer", "",
                  'model = SentenceTransformer("path/to/this/folder")',
                  f'vectors = model.encode(["what is the weather in Paris?"]{kw}, normalize_embeddings=True)', "```",
                  "", "Tools are encoded from their text, name and description first "
                  "(`toolgraph.data.schema.Tool.document`)."]
    else:
        lines += ["```python", "import toolgraph", "", 'retriever = toolgraph.load("path/to/this/folder")',
                  'ranked = retriever.retrieve(["what is the weather in Paris?"], k=5)',
                  "print(ranked.ids[0], ranked.scores[0])", "```", "",
                  "or `toolgraph retrieve --checkpoint path/to/this/folder \"what is the weather in Paris?\"`; "
                  "`toolgraph serve` serves it over MCP."]
    if prompts:
        lines += ["", "Trained with prompts (saved as this encoder's sentence-transformers `prompts`; toolgraph's "
                  "dense retriever applies them): " + ", ".join(f"{k} `{v!r}`" for k, v in prompts.items())
                  + (". Encode tools with `prompt_name=\"document\"`." if encoder_folder and "document" in prompts
                     else ".")]
    table = _table(metrics)
    lines += ["", f"## Results ({dataset}, {split} split)", ""]
    lines += [table] if table else ["Not evaluated with this export: `python evaluate.py` or "
                                    "`toolgraph evaluate` measures it."]
    if training:
        lines += ["", "## Training", ""]
        for key in ("steps", "train_seconds", "examples_per_second", "device"):
            if key in training:
                lines.append(f"- {key.replace('_', ' ')}: {training[key]}")
    lines += ["", "The run's config (saved as a file, `python train.py --config FILE` trains it again):", "", "```yaml",
              yaml.safe_dump(config, sort_keys=False, allow_unicode=True).rstrip(), "```"]
    lines += ["", "## Intended use and limits", "",
              f"- Ranking tools of the {dataset} catalog (or a similar one) for agent requests, as the first "
              "stage in front of an LLM that calls the tools. Measured only on the split above.",
              "- Tools and requests unlike the training data (other domains, other languages) rank worse: "
              "measure on your own catalog before relying on it.",
              "- The training data's license is the dataset's (see its SOURCE.txt and original repository); "
              "the weights' license is the base model's" + (f" ({license_id})." if named else "."),
              "- It ranks; it does not check that a tool is safe or that its call will succeed."]
    return "\n".join(lines) + "\n"


def write_cards(folder: str | Path, results: dict[str, Any], name: str | None = None) -> list[Path]:
    """README.md in an exported retriever ``folder`` and in its ``encoder/`` if there is one (files
    the manifest does not list: loading ignores them)."""
    folder = Path(folder)
    if name is None:  # <run>/retriever is named after its run
        name = folder.resolve().parent.name if folder.name == "retriever" else folder.resolve().name
    written = [write_text_atomic(folder / "README.md", render_card(results, name))]
    if (folder / "encoder").is_dir():
        written.append(write_text_atomic(folder / "encoder" / "README.md",
                                         render_card(results, f"{name}-encoder", encoder_folder=True)))
    return written
