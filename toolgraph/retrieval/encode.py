"""Batched text encoding: length-sorted batches, dynamic padding, inference mode, progress bar."""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from toolgraph.nn.encoder import TextEncoder


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
    desc = progress if isinstance(progress, str) else "encoding"
    bar = tqdm(total=len(texts), desc=desc, unit="text", disable=not progress, leave=False)
    for lo in range(0, len(order), batch_size):
        idx = order[lo:lo + batch_size]
        batch = tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=max_length,
                          return_tensors="pt")
        batch = {k: v.to(device) for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        out[idx] = encoder(**batch).float().cpu()  # [B, H]
        bar.update(len(idx))
    bar.close()
    return out
