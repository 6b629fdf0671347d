"""Frozen lower layers with cached activations.

Tool catalogs are small and training texts are fixed, so the output of a frozen bottom (embeddings
+ the first K transformer layers) is the same every epoch: compute it once, in eval mode without gradients, keep
it in fp16 (``PackedStates``, only real tokens, no padding) and train only the layers above
(``run_layers``). Works with BERT-style backbones (``embeddings`` + ``encoder.layer``: BERT, MiniLM,
RoBERTa, ELECTRA, ...) and MPNet (its encoder's relative-position bias goes to every layer); DeBERTa's
relative-position encoder is refused with a clear message.

A task declares it as one component: its ``Config`` extends ``FrozenBottomConfig`` (``freeze_layers``,
``states_dir``) and it holds a ``FrozenBottom`` (freezes its backbones, makes its datamodule serve
indices instead of tokens, builds and serves the cached states).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from toolgraph.config import bounded
from toolgraph.errors import ConfigError, DataError
from toolgraph.files import atomic_path


def stack(backbone: nn.Module) -> tuple[nn.Module, nn.ModuleList]:
    """(embeddings, transformer layers) of a BERT-style backbone, or a ConfigError."""
    emb = getattr(backbone, "embeddings", None)
    enc = getattr(backbone, "encoder", None)
    layers = getattr(enc, "layer", None)
    if emb is None or not isinstance(layers, nn.ModuleList) or hasattr(enc, "rel_embeddings"):
        raise ConfigError(f"model.freeze_layers: needs a BERT-style encoder (embeddings + encoder.layer: BERT, "
                          f"RoBERTa, MPNet, ...; not DeBERTa's relative positions); {type(backbone).__name__} is "
                          "not one. Use freeze_layers: 0")
    return emb, layers


def check_depth(backbone: nn.Module, k: int) -> None:
    n = len(stack(backbone)[1])
    if not 0 <= k < n:
        raise ConfigError(f"model.freeze_layers: {k} must be in [0, {n - 1}] for a {n}-layer encoder "
                          "(at least the top layer trains)")


def freeze_bottom(backbone: nn.Module, k: int) -> None:
    """Stop gradients to the embeddings and the first ``k`` layers (k=0: nothing frozen)."""
    if k <= 0:
        return
    check_depth(backbone, k)
    emb, layers = stack(backbone)
    for module in [emb, *layers[:k]]:
        for p in module.parameters():
            p.requires_grad_(False)


def layer_mask(backbone: nn.Module, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor | None:
    """The attention mask the backbone's own forward would hand its layers (eager or SDPA)."""
    try:
        from transformers.masking_utils import create_bidirectional_mask
    except ImportError:  # transformers < 4.56: the additive [B, 1, 1, L] mask
        return backbone.get_extended_attention_mask(attention_mask, attention_mask.shape)
    return create_bidirectional_mask(config=backbone.config, inputs_embeds=hidden, attention_mask=attention_mask)


def run_layers(backbone: nn.Module, hidden: torch.Tensor, attention_mask: torch.Tensor, start: int,
               stop: int | None = None) -> torch.Tensor:
    """Transformer layers ``start:stop`` over ``hidden`` [B, L, H] -> [B, L, H]."""
    layers = stack(backbone)[1][start:stop]
    mask = layer_mask(backbone, hidden, attention_mask)
    extra = ()
    position_bias = getattr(backbone.encoder, "compute_position_bias", None)
    if position_bias is not None:  # MPNet: one relative-position bias, computed by the encoder, feeds every layer
        extra = (position_bias(hidden),)
    for layer in layers:
        out = layer(hidden, mask, *extra)
        hidden = out[0] if isinstance(out, tuple) else out
    return hidden


def bottom_states(backbone: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, k: int) -> torch.Tensor:
    """Embeddings + first ``k`` layers [B, L, H], in eval mode without a graph (no dropout)."""
    emb = stack(backbone)[0]
    was = backbone.training
    backbone.eval()
    try:
        with torch.no_grad():
            return run_layers(backbone, emb(input_ids=input_ids), attention_mask, 0, k)
    finally:
        backbone.train(was)


class PackedStates:
    """Per-text hidden states [len_i, H] packed into one tensor [sum len_i, H] (fp16 by default, no padding)."""

    def __init__(self, flat: torch.Tensor, offsets: torch.Tensor):
        self.flat, self.offsets = flat, offsets  # [T, H] fp16, [n + 1] int64
        self.lengths = (offsets[1:] - offsets[:-1]).tolist()

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    @classmethod
    def build(cls, backbone: nn.Module, tokenizer, texts: Sequence[str], k: int, max_length: int,
              batch_size: int = 128, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float16,
              ) -> PackedStates:
        """Run the frozen bottom over ``texts`` in length-sorted batches (little padding); stored as ``dtype``."""
        ids = tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        lengths = torch.tensor([len(x) for x in ids], dtype=torch.long)
        offsets = torch.zeros(len(ids) + 1, dtype=torch.long)
        offsets[1:] = lengths.cumsum(0)
        flat = torch.empty(int(offsets[-1]), backbone.config.hidden_size, dtype=dtype)
        pad = tokenizer.pad_token_id or 0
        for s in range(0, len(order), batch_size):
            rows = order[s:s + batch_size]
            width = max(len(ids[i]) for i in rows)
            input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for j, i in enumerate(rows):
                input_ids[j, :len(ids[i])] = torch.tensor(ids[i])
                mask[j, :len(ids[i])] = 1
            hidden = bottom_states(backbone, input_ids.to(device), mask.to(device), k).to("cpu", dtype)
            for j, i in enumerate(rows):
                flat[offsets[i]:offsets[i + 1]] = hidden[j, :len(ids[i])]
        return cls(flat, offsets)

    def batch(self, index: torch.Tensor | Sequence[int], device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden [B, L, H], attention mask [B, L]) of the texts ``index``, padded to the longest."""
        rows = [int(i) for i in index]
        width = max(self.lengths[i] for i in rows)
        hidden = torch.zeros(len(rows), width, self.flat.shape[1], dtype=self.flat.dtype)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for j, i in enumerate(rows):
            n = self.lengths[i]
            hidden[j, :n] = self.flat[self.offsets[i]:self.offsets[i] + n]
            mask[j, :n] = 1
        return hidden.to(device=device, dtype=dtype), mask.to(device)

    def encode(self, encoder: nn.Module, index: torch.Tensor | Sequence[int], layer: int,
               device: torch.device | str = "cpu", chunk: int = 32) -> torch.Tensor:
        """``encoder.forward_from`` over the texts ``index`` -> [B, H] in the order given, run in
        length-sorted chunks of ``chunk`` texts so that little compute goes to padding."""
        rows = [int(i) for i in index]
        order = sorted(range(len(rows)), key=lambda j: self.lengths[rows[j]])
        parts = []
        for s in range(0, len(order), chunk):
            hidden, mask = self.batch([rows[j] for j in order[s:s + chunk]], device)
            parts.append(encoder.forward_from(hidden, mask, layer))
        out = torch.cat(parts)  # [B, H] in length order
        inverse = torch.empty(len(order), dtype=torch.long, device=out.device)
        inverse[torch.tensor(order, device=out.device)] = torch.arange(len(order), device=out.device)
        return out[inverse]

    def select(self, rows: Sequence[int]) -> PackedStates:
        """The states of texts ``rows`` (in that order, repeats allowed) as a new ``PackedStates``."""
        rows = [int(i) for i in rows]
        lengths = torch.tensor([self.lengths[i] for i in rows], dtype=torch.long)
        offsets = torch.zeros(len(rows) + 1, dtype=torch.long)
        offsets[1:] = lengths.cumsum(0)
        flat = torch.cat([self.flat[self.offsets[i]:self.offsets[i + 1]] for i in rows]) if rows else self.flat[:0]
        return PackedStates(flat, offsets)

    def concat(self, other: PackedStates) -> PackedStates:
        return PackedStates(torch.cat([self.flat, other.flat.to(self.flat.dtype)]),
                            torch.cat([self.offsets, other.offsets[1:] + self.offsets[-1]]))

    def save(self, path: Path, keys: Sequence[str] | None = None) -> None:
        """To ``path`` (atomically); ``keys``: one per text, so that a later run finds its texts by key."""
        with atomic_path(path) as tmp:
            torch.save({"flat": self.flat, "offsets": self.offsets, **({"keys": list(keys)} if keys is not None else {})},
                       tmp)

    @classmethod
    def load(cls, path: Path, n: int | None, hidden: int) -> PackedStates:
        """Read a saved cache; a DataError (naming the file) unless it holds ``n`` texts (None: as many
        as its keys) of width ``hidden``."""
        return cls._read(path, n, hidden)[0]

    @classmethod
    def _read(cls, path: Path, n: int | None, hidden: int) -> tuple[PackedStates, list[str] | None]:
        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
            flat, offsets, keys = data["flat"], data["offsets"], data.get("keys")
            n = len(keys) if n is None and keys is not None else n
            ok = (flat.ndim == 2 and flat.shape[1] == hidden and n is not None and offsets.shape == (n + 1,)
                  and int(offsets[-1]) == flat.shape[0] and bool((offsets[1:] >= offsets[:-1]).all()))
        except Exception as e:  # noqa: BLE001 - a cut or foreign file: one clear message
            raise DataError(f"unreadable activation cache ({type(e).__name__}); delete it to rebuild", path) from None
        if not ok:
            raise DataError(f"activation cache does not fit: expected {n} texts of width {hidden}; delete it to "
                            "rebuild", path)
        return cls(flat, offsets), keys


def cache_key(backbone: nn.Module, tokenizer, k: int, max_length: int) -> str:
    """Hash of what the cached states depend on besides the text: the frozen weights, the tokenizer, K
    and the truncation length. One cache file per key holds every text encoded so far."""
    h = hashlib.sha1(f"{type(backbone).__name__}|{k}|{max_length}".encode())
    emb, layers = stack(backbone)
    for module in [emb, *layers[:k]]:
        for name, t in module.state_dict().items():
            h.update(name.encode())
            h.update(t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    vocab = sorted(tokenizer.get_vocab().items())
    h.update(f"{type(tokenizer).__name__}|{vocab}|{getattr(tokenizer, 'do_lower_case', None)}".encode())
    return h.hexdigest()[:20]


def text_key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def cached_states(backbone: nn.Module, tokenizer, texts: Sequence[str], k: int, max_length: int,
                  cache_dir: str | Path | None, batch_size: int = 128, device: torch.device | str = "cpu") -> PackedStates:
    """``PackedStates`` of ``texts`` from ``cache_dir/states-<cache_key>.pt``, a store keyed by text:
    only the texts it lacks are run through the frozen bottom and added. So the runs of a
    leave-one-dataset-out sweep, each on a different subset of the same texts, share one cache."""
    if cache_dir is None:
        return PackedStates.build(backbone, tokenizer, texts, k, max_length, batch_size, device)
    path = Path(cache_dir) / f"states-{cache_key(backbone, tokenizer, k, max_length)}.pt"
    store, keys = (PackedStates._read(path, None, backbone.config.hidden_size) if path.is_file() else (None, None))
    keys = list(keys or [])
    row = {key: i for i, key in enumerate(keys)}
    wanted = [text_key(t) for t in texts]
    missing = {key: t for t, key in zip(texts, wanted, strict=True) if key not in row}  # each text once
    if missing:
        new = PackedStates.build(backbone, tokenizer, list(missing.values()), k, max_length, batch_size, device)
        store = new if store is None else store.concat(new)
        for key in missing:
            row[key] = len(keys)
            keys.append(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        store.save(path, keys)
    if store is None:  # no texts asked for, none cached
        return PackedStates.build(backbone, tokenizer, texts, k, max_length, batch_size, device)
    rows = [row[key] for key in wanted]
    return store if rows == list(range(len(store))) else store.select(rows)


@dataclass
class FrozenBottomConfig:
    """The frozen bottom's keys of a task's ``model:`` section (a task's ``Config`` extends it)."""

    freeze_layers: int = bounded(0, ge=0)  # embeddings + the first K layers frozen, their outputs cached
    states_dir: str | None = ".cache/toolgraph"  # cached activations (freeze_layers > 0); None = in memory only


class FrozenBottom:
    """The frozen bottom of a task (``model.freeze_layers: K``, ``model.states_dir``); K = 0: off, and
    every method a no-op.

    * built with the task's backbones: their embeddings and first K layers stop training
      (``freeze_bottom``, which refuses a depth the backbone lacks or a backbone that is not BERT-style);
    * ``serve(dm, name=(backbone, texts, max_length), ...)`` from ``make_datamodule``: the datamodule's
      training batches carry text indices instead of tokens, and these are the texts (per side: queries,
      tools) whose states ``build`` computes;
    * ``build(tokenizer, batch_size, device, log)`` from ``on_train_start`` (inside the time
      ``trainer.max_time`` counts): each side's states, read from or added to ``states_dir``
      (``cached_states``), kept in fp16 on the CPU;
    * ``encode(name, encoder, index, device)`` -> [B, H] (the layers above and the pooling), or
      ``batch(name, index, device)`` -> (hidden [B, L, H], mask [B, L]) for a network that runs the layers
      above itself.

    Nothing here is saved: the states are rebuilt from the data at the start of every fit."""

    def __init__(self, cfg: FrozenBottomConfig, *backbones: nn.Module):
        self.k, self.states_dir = cfg.freeze_layers, cfg.states_dir
        for backbone in {id(b): b for b in backbones}.values():  # a shared backbone once
            freeze_bottom(backbone, self.k)
        self.sides: dict[str, tuple[nn.Module, Sequence[str], int]] = {}
        self.states: dict[str, PackedStates] = {}

    def __bool__(self) -> bool:
        return self.k > 0

    def serve(self, dm: Any, **sides: tuple[nn.Module, Sequence[str], int]) -> None:
        dm.tokenize_train = not self.k  # cached states replace tokens
        self.sides, self.states = dict(sides), {}

    def build(self, tokenizer: Any, batch_size: int, device: torch.device | str,
              log: Callable[[str], None] | None = None) -> None:
        self.states = {}
        if not self.k or not self.sides or not any(texts for _, texts, _ in self.sides.values()):
            return
        start = time.perf_counter()
        for name, (backbone, texts, max_length) in self.sides.items():
            self.states[name] = cached_states(backbone, tokenizer, texts, self.k, max_length, self.states_dir,
                                              batch_size, device)
        if log is not None:
            counts = " and ".join(f"{len(s)} {name}" for name, s in self.states.items())
            mb = sum(s.nbytes for s in self.states.values()) / 2**20
            log(f"frozen bottom (embeddings + {self.k} layers): states of {counts}, {mb:.0f} MiB fp16, "
                f"{time.perf_counter() - start:.1f} s")

    def _side(self, name: str) -> PackedStates:
        if name not in self.states:
            raise RuntimeError(f"frozen bottom: no states of {name!r} (build() runs at the start of training)")
        return self.states[name]

    def encode(self, name: str, encoder: nn.Module, index: torch.Tensor | Sequence[int],
               device: torch.device | str) -> torch.Tensor:
        return self._side(name).encode(encoder, index, self.k, device)

    def batch(self, name: str, index: torch.Tensor | Sequence[int], device: torch.device | str
              ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._side(name).batch(index, device)
