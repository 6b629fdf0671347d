"""Batched text encoding: length-sorted batches, dynamic padding, inference mode, progress bar."""

from __future__ import annotations

import torch

from toolgraph.nn.encoder import TextEncoder
from toolgraph.retrieval.progress import batches


@torch.inference_mode()
def encode_texts(encoder: TextEncoder, tokenizer, texts: list[str], batch_size: int = 64, max_length: int = 256,
                 device: str | torch.device = "cpu", progress: bool | str = False) -> torch.Tensor:
    """texts -> [len(texts), H] float32 on CPU, in input order.

    Sorting by length puts similar lengths in one batch, so padding (wasted compute) is small."""
    if not texts:
        return torch.zeros(0, encoder.dim)
    encoder.eval()
    lengths = [len(t) for t in texts]  # characters: a cheap proxy for tokens
    order = sorted(range(len(texts)), key=lambda i: -lengths[i])
    out = torch.empty(len(texts), encoder.dim)
    label = "encoding" if progress is True else progress
    for part in batches(len(order), batch_size, label, unit="text", leave=False):  # often inside a ranking's bar
        idx = order[part]
        batch = tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=max_length,
                          return_tensors="pt")
        batch = {k: v.to(device) for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        out[idx] = encoder(**batch).float().cpu()  # [B, H]
    return out
