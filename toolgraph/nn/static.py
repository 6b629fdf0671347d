"""A static text encoder distilled from a transformer: one vector per vocabulary token, no layers.

    table = distill_static(backbone, tokenizer, counts)      # [V, H]
    save_static(table, tokenizer, "models/minilm-static")     # a model folder load_backbone reads

Each token's vector is the transformer's mean-pooled output for ``[CLS] token [SEP]``; the table is
centred and its top ``drop`` principal components removed (they carry what all tokens share, not
meaning), then each row is scaled by the SIF weight ``a / (a + p(token))``, ``p`` from token counts of
a corpus (frequent tokens weigh little). A text's vector is the mean of its tokens' rows (special
tokens are zero rows), so ``TextEncoder``'s mean pooling and normalisation apply unchanged. Encoding is
a table lookup: on 2 CPU cores ~1,000x faster than MiniLM, at a cost in quality measured in
docs/agents-and-serving.md (the registry-scale section), which is what it is for: catalogs of a million
tools without a GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from toolgraph.errors import DataError

MODEL_TYPE = "toolgraph-static"
WEIGHTS = "static.safetensors"


class StaticBackbone(nn.Module):
    """Token ids -> their rows of the table, as ``last_hidden_state`` [B, L, H] (the shape of a
    transformer's output, so ``TextEncoder`` pools it like any backbone)."""

    def __init__(self, table: torch.Tensor, meta: dict | None = None):
        super().__init__()
        self.embeddings = nn.Embedding(*table.shape)
        self.embeddings.weight = nn.Parameter(table.float(), requires_grad=False)  # a fixed table
        self.config = SimpleNamespace(model_type=MODEL_TYPE, hidden_size=table.shape[1], vocab_size=table.shape[0],
                                      **(meta or {}))

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_: torch.Tensor):
        return SimpleNamespace(last_hidden_state=self.embeddings(input_ids))


@torch.inference_mode()
def token_vectors(backbone: nn.Module, tokenizer, batch: int = 1024) -> torch.Tensor:
    """[V, H]: each token id's mean-pooled output for ``[CLS] token [SEP]``."""
    backbone.eval()
    vocab = len(tokenizer)
    first = next(backbone.parameters())
    out = torch.empty(vocab, int(backbone.config.hidden_size))
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    for lo in range(0, vocab, batch):
        ids = torch.arange(lo, min(lo + batch, vocab))
        seq = torch.stack([torch.full_like(ids, cls), ids, torch.full_like(ids, sep)], 1).to(first.device)
        out[lo:lo + len(ids)] = backbone(input_ids=seq, attention_mask=torch.ones_like(seq)).last_hidden_state.mean(1).float().cpu()
    return out


def distill_static(backbone: nn.Module, tokenizer, counts: torch.Tensor, a: float = 1e-3, drop: int = 16,
                   vectors: torch.Tensor | None = None) -> torch.Tensor:
    """The static table [V, H] (see the module doc); ``counts`` [V]: each token's count in a corpus;
    ``vectors``: :func:`token_vectors` when already computed."""
    table = token_vectors(backbone, tokenizer) if vectors is None else vectors
    table = table - table.mean(0)
    if drop:
        _, _, vt = torch.linalg.svd(table, full_matrices=False)
        top = vt[:drop]  # [drop, H]
        table = table - (table @ top.T) @ top
    p = counts.float() / counts.sum().clamp(min=1)
    table = table * (a / (a + p)).unsqueeze(1)
    table[list(tokenizer.all_special_ids)] = 0.0  # [CLS], [SEP], [PAD]... add nothing to a text
    return table


def save_static(table: torch.Tensor, tokenizer, folder: str | Path, meta: dict | None = None) -> Path:
    """A model folder: ``config.json`` (model_type toolgraph-static), the table, the tokenizer files."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"table": table.contiguous()}, str(folder / WEIGHTS))
    tokenizer.save_pretrained(folder)
    config = {"model_type": MODEL_TYPE, "hidden_size": int(table.shape[1]), "vocab_size": int(table.shape[0]),
              "toolgraph_static": meta or {}}
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return folder


def is_static(folder: str | Path) -> bool:
    path = Path(folder) / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("model_type") == MODEL_TYPE
    except (OSError, ValueError, AttributeError):
        return False


def load_static(folder: str | Path) -> StaticBackbone:
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    try:
        table = load_file(str(folder / WEIGHTS))["table"]
    except (OSError, KeyError, RuntimeError) as e:
        raise DataError(f"cannot read the static encoder's table ({type(e).__name__}); rebuild it with "
                        "toolgraph encoder static", folder / WEIGHTS) from None
    if list(table.shape) != [config.get("vocab_size"), config.get("hidden_size")]:
        raise DataError(f"the table is {list(table.shape)} but config.json says vocab_size "
                        f"{config.get('vocab_size')}, hidden_size {config.get('hidden_size')}; rebuild it", folder)
    return StaticBackbone(table, {"toolgraph_static": config.get("toolgraph_static", {})})
