"""Tool pairs for the dependency discriminator: a collator and the LightningDataModule.

Each pair is read jointly as ``[CLS] doc_a [SEP] doc_b [SEP]`` (truncation trims the longer
document first, and documents start with name and description, so the cut keeps them). Eval
batches are sorted by length (less padding); training batches come from the seeded, rank-sharded
``ShuffledBatchSampler`` so a resumed run sees the same batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from toolgraph.config import TextDataConfig
from toolgraph.data.tdi import LABEL_INDEX, Pair, TDISet
from toolgraph.data.text import ResumableDataModule, ShuffledBatchSampler
from toolgraph.errors import ConfigError


class PairCollator:
    """(pair index, draw seed) or pair indices -> token tensors, labels [B], weights [B], index [B]."""

    def __init__(self, tokenizer, pairs: Sequence[Pair], documents: dict[str, str], max_length: int):
        self.tok, self.pairs, self.docs, self.max_length = tokenizer, pairs, documents, max_length

    def __call__(self, items: list[Any]) -> dict[str, Any]:
        idx = [i[0] if isinstance(i, tuple) else i for i in items]
        chosen = [self.pairs[i] for i in idx]
        tok = self.tok([self.docs[p.tool_a] for p in chosen], [self.docs[p.tool_b] for p in chosen],
                       padding=True, truncation="longest_first", max_length=self.max_length, return_tensors="pt")
        return {"inputs": {k: v for k, v in tok.items() if k in ("input_ids", "attention_mask", "token_type_ids")},
                "labels": torch.tensor([LABEL_INDEX[p.label] for p in chosen]),  # [B]
                "weights": torch.tensor([p.weight for p in chosen], dtype=torch.float),  # [B]
                "index": torch.tensor(idx)}  # [B] position in the served list


def length_sorted_loader(tokenizer, pairs: Sequence[Pair], documents: dict[str, str], max_length: int,
                         batch_size: int, rank: int = 0, world: int = 1, **loader_kw: Any) -> DataLoader:
    """Pairs in order of document length (less padding), every ``world``-th one from ``rank``."""
    order = sorted(range(len(pairs)), key=lambda i: len(documents[pairs[i].tool_a]) + len(documents[pairs[i].tool_b]))
    return DataLoader(order[rank::world], batch_size=batch_size, shuffle=False,
                      collate_fn=PairCollator(tokenizer, pairs, documents, max_length), **loader_kw)


class PairDataModule(ResumableDataModule):
    """Serves one training set of a TDISet (``pretrain`` or ``finetune``) plus its val and test."""

    def __init__(self, tdi: TDISet, train_set: str, cfg: TextDataConfig, tokenizer, max_length: int, seed: int = 0):
        super().__init__()
        for name in (train_set, "val", "test"):
            if not tdi.pairs.get(name):
                raise ConfigError(f"the TDI data has no {name!r} pairs (needed to train on {train_set!r})")
        self.tdi, self.train_set, self.cfg, self.tok = tdi, train_set, cfg, tokenizer
        self.max_length, self.seed, self.num_workers = max_length, seed, cfg.num_workers
        self.train_pairs = tdi.pairs[train_set]

    def train_size(self) -> int:
        return len(self.train_pairs)

    def train_sampler(self, rank: int, world: int) -> Sampler:
        return ShuffledBatchSampler(len(self.train_pairs), self.cfg.batch_size, self.seed, rank, world)

    def train_collator(self) -> Any:
        return PairCollator(self.tok, self.train_pairs, self.tdi.documents, self.max_length)

    def class_counts(self) -> list[int]:
        """Examples per class in the training set (N_k over the dataset)."""
        counts = [0] * len(LABEL_INDEX)
        for p in self.train_pairs:
            counts[LABEL_INDEX[p.label]] += 1
        return counts

    def eval_loader(self, pairs: Sequence[Pair]) -> DataLoader:
        rank, world = self._rank_world()
        return length_sorted_loader(self.tok, pairs, self.tdi.documents, self.max_length, self.cfg.eval_batch_size,
                                    rank, world, num_workers=self.num_workers, generator=self._generator())

    def val_dataloader(self) -> DataLoader:
        return self.eval_loader(self.tdi.pairs["val"])

    def test_dataloader(self) -> DataLoader:
        return self.eval_loader(self.tdi.pairs["test"])


class FeatureCollator:
    """Pair indices (or (index, seed)) -> ``{"inputs": featurize(indices), labels, weights, index}``:
    for models that read precomputed pair features rather than tokens."""

    def __init__(self, pairs: Sequence[Pair], featurize: Callable[[list[int]], dict[str, torch.Tensor]]):
        self.pairs, self.featurize = pairs, featurize

    def __call__(self, items: list[Any]) -> dict[str, Any]:
        idx = [i[0] if isinstance(i, tuple) else i for i in items]
        chosen = [self.pairs[i] for i in idx]
        return {"inputs": self.featurize(idx),
                "labels": torch.tensor([LABEL_INDEX[p.label] for p in chosen]),  # [B]
                "weights": torch.tensor([p.weight for p in chosen], dtype=torch.float),  # [B]
                "index": torch.tensor(idx)}  # [B]


def rows_of(tensors: dict[str, torch.Tensor]) -> Callable[[list[int]], dict[str, torch.Tensor]]:
    """featurize by row lookup in precomputed per-pair tensors."""
    return lambda idx: {k: v[idx] for k, v in tensors.items()}


class FeaturePairDataModule(PairDataModule):
    """``PairDataModule`` serving precomputed pair features: ``tensors[set name]`` holds, per input
    name, one row per pair of that set (same order as ``tdi.pairs[set name]``)."""

    def __init__(self, tdi: TDISet, train_set: str, cfg: TextDataConfig, tensors: dict[str, dict[str, torch.Tensor]],
                 seed: int = 0):
        super().__init__(tdi, train_set, cfg, None, 0, seed)
        for name in (train_set, "val", "test"):
            for key, rows in tensors[name].items():
                if rows.shape[0] != len(tdi.pairs[name]):
                    raise ValueError(f"{key} of {name!r}: {rows.shape[0]} rows for {len(tdi.pairs[name])} pairs")
        self.tensors = tensors

    def train_collator(self) -> Any:
        return FeatureCollator(self.train_pairs, rows_of(self.tensors[self.train_set]))

    def _loader(self, name: str) -> DataLoader:
        rank, world = self._rank_world()
        pairs = self.tdi.pairs[name]
        return DataLoader(list(range(len(pairs)))[rank::world], batch_size=self.cfg.eval_batch_size, shuffle=False,
                          collate_fn=FeatureCollator(pairs, rows_of(self.tensors[name])), num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")
