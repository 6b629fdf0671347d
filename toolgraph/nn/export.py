"""Export a trained text encoder as a sentence-transformers folder (safetensors weights).

``SentenceTransformer(folder)`` loads it and produces the same vectors as toolgraph's
``TextEncoder`` (same pooling, same normalisation, same max length), without a load report: a
BERT-like backbone is loaded by toolgraph without its pooler (``add_pooling_layer=False``; the pooler is
unused by mean / CLS pooling), so it is saved without one, and ``sentence_bert_config.json`` passes
the same ``add_pooling_layer: false`` to ``from_pretrained`` (``model_args``, which sentence-transformers
2.x to 6.x read): otherwise transformers reports ``pooler.dense MISSING ... newly initialized``."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

from toolgraph.nn.encoder import PROMPTS_FILE, TextEncoder


def export_sentence_transformer(encoder: TextEncoder, tokenizer, folder: str | Path, max_length: int,
                                prompts: dict[str, str] | None = None) -> Path:
    """``prompts``: the text the encoder was trained to see before queries (``"query"``) and tool
    documents (``"document"``); saved as sentence-transformers' ``prompts``, which toolgraph's dense
    retriever applies by default (``encode(texts, prompt_name="query")`` in sentence-transformers)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    encoder.backbone.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if encoder.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (folder / "2_Normalize").mkdir(exist_ok=True)
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    config: dict[str, Any] = {"max_seq_length": max_length, "do_lower_case": False}
    if _without_pooler(encoder.backbone):
        config["model_args"] = {"add_pooling_layer": False}
    (folder / "sentence_bert_config.json").write_text(json.dumps(config))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": encoder.dim, "pooling_mode_cls_token": encoder.pooling == "cls",
               "pooling_mode_mean_tokens": encoder.pooling == "mean", "pooling_mode_max_tokens": False,
               "pooling_mode_mean_sqrt_len_tokens": False}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    prompts = {k: v for k, v in (prompts or {}).items() if v}
    if prompts:
        (folder / PROMPTS_FILE).write_text(json.dumps({"prompts": prompts, "default_prompt_name": None,
                                                       "similarity_fn_name": "cosine"}, indent=2))
    return folder


def _without_pooler(backbone: Any) -> bool:
    """The backbone's class takes ``add_pooling_layer`` (BERT, RoBERTa, ...) and this one was built without
    its pooler: a plain ``from_pretrained`` of the saved folder would create a random one and say so."""
    try:
        takes = "add_pooling_layer" in inspect.signature(type(backbone).__init__).parameters
    except (TypeError, ValueError):
        return False
    return takes and getattr(backbone, "pooler", None) is None
