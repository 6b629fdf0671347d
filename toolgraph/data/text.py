"""Text data for encoder tasks: a contrastive batch sampler, collators and the LightningDataModule.

Training batches pair each query with one of its gold tools (re-drawn every epoch). The batch
sampler packs pairs so that no tool appears twice in a batch (a duplicate would be its own
false negative) and shards whole batches across DDP ranks. Queries and tools are tokenized per
batch with dynamic padding (pad to the longest text in the batch, not to max_length).
"""

from __future__ import annotations

import random
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Sampler

from toolgraph.config import TextDataConfig
from toolgraph.data.schema import Tool, ToolDataset, natural_key
from toolgraph.data.sources.mixture import pinned_groups, source_groups


class ContrastiveBatchSampler(Sampler[list[tuple[int, int, int]]]):
    """Yields batches of (query index, positive tool index, hard negative tool index or -1); no
    positive tool twice within a batch.

    Deterministic in (seed, epoch): every random draw happens here, none in the collator, so a
    resumed epoch sees exactly the batches an uninterrupted one would. Under DDP each rank takes
    every W-th batch of the same global plan, and all ranks get the same number of full batches
    (the cross-rank gather needs equal sizes). ``skip`` batches are dropped from the start once
    (mid-epoch resume)."""

    def __init__(self, gold: Sequence[Sequence[int]], batch_size: int, seed: int = 0, rank: int = 0, world: int = 1,
                 hard_negatives: Sequence[Sequence[int]] | None = None, lengths: Sequence[int] | None = None,
                 groups: Sequence[int] | None = None, temperature: float = 1.0,
                 pinned: tuple[frozenset[int], float] | None = None, max_per_tool: int | None = None):
        self.gold = [list(g) for g in gold]
        self.max_per_tool = max_per_tool  # per pass: at most this many queries with one tool as their positive
        self.kept = len(self.gold)  # without groups: training queries the last plan kept (fewer under a cap)
        self.hard = hard_negatives
        self.lengths = lengths  # query lengths in tokens: batches of similar lengths (little padding)
        self.groups = list(groups) if groups is not None else None  # source dataset of each query (mixtures)
        self.temperature = temperature
        self.pinned = pinned  # (groups, share): those groups together get this share of the batches
        if self.groups is not None and len(self.groups) != len(self.gold):
            raise ValueError(f"{len(self.groups)} groups for {len(self.gold)} queries")
        if any(not g for g in self.gold):
            raise ValueError("every training query needs at least one gold tool")
        self.batch_size, self.seed, self.rank, self.world = batch_size, seed, rank, world
        self.epoch = 0
        self.skip = 0
        self.duplicates = 0  # queries of the last plan placed beside a batch-mate with the same positive
        self._plan: tuple[int, list] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def plan(self) -> list[list[tuple[int, int, int]]]:
        """The global batch plan of this epoch, before sharding (cached per epoch).

        Without groups: every query once, packed by ``pack``. With groups (a mixture of datasets) every
        batch holds queries of one group, so its negatives come from one catalog; group g gets a share
        of the epoch's batches proportional to n_g^(1/T) (``temperature`` T: 1 = by size, larger = flatter,
        small groups repeated and large ones subsampled), its queries packed pass after pass as needed.
        ``pinned`` (groups, s): those groups together get the share s of the batches (split among them
        as above), the others 1 - s (self-supervised components of a mixture)."""
        if self._plan is not None and self._plan[0] == self.epoch:
            return self._plan[1]
        rng = random.Random(self.seed * 1_000_003 + self.epoch)
        if self.groups is None:
            kept, positive = self.capped(list(range(len(self.gold))), rng)
            self.kept = len(kept)
            full = self.pack(kept, rng, positive)  # too few for a batch: refused
        else:
            members: dict[int, list[int]] = {}
            for q, g in enumerate(self.groups):
                members.setdefault(g, []).append(q)
            total = max(1, len(self.gold) // self.batch_size)
            weight = {g: len(m) ** (1.0 / self.temperature) for g, m in members.items()}
            if self.pinned:
                inside, share = self.pinned
                w_in = sum(w for g, w in weight.items() if g in inside)
                w_out = sum(w for g, w in weight.items() if g not in inside)
                if w_in and w_out:
                    weight = {g: w * share * w_out / ((1 - share) * w_in) if g in inside else w
                              for g, w in weight.items()}
            norm = sum(weight.values())
            full = []
            for g in sorted(members):
                want = max(1, round(total * weight[g] / norm))
                mine: list[list[tuple[int, int]]] = []
                while len(mine) < want:  # passes over the group (each packs at least one full batch)
                    kept, positive = self.capped(members[g], rng)
                    mine += self.pack(self.filled(kept), rng, positive)
                full += mine[:want]
        self.duplicates = sum(len(b) - len({t for _, t in b}) for b in full)
        rng.shuffle(full)
        usable = len(full) // self.world * self.world
        plan = [[(q, t, rng.choice(self.hard[q]) if self.hard else -1) for q, t in batch]
                for batch in full[:usable]][self.rank::self.world]
        self._plan = (self.epoch, plan)
        return plan

    def capped(self, queries: list[int], rng: random.Random) -> tuple[list[int], dict[int, int] | None]:
        """One pass's ``queries`` with at most ``max_per_tool`` of them for any one tool, and each kept query's
        positive: in a seeded random order each query draws one of its gold tools and is kept, with that tool as
        its positive, while the tool is under the cap. A dataset's passes then spread over its tools instead of
        repeating its most asked-for ones (ToolLinkOS: one tool is the answer to 1,254 of 1,569 requests).
        Without a cap: ``queries`` unchanged and no positives fixed (``pack`` chooses them)."""
        if self.max_per_tool is None:
            return queries, None
        count: dict[int, int] = {}
        positive: dict[int, int] = {}
        for q in rng.sample(queries, len(queries)):
            t = rng.choice(self.gold[q])
            if count.get(t, 0) < self.max_per_tool:
                count[t] = count.get(t, 0) + 1
                positive[q] = t
        return sorted(positive), positive

    def filled(self, queries: list[int]) -> list[int]:
        """A mixture group's ``queries``, repeated as often as it takes to fill one batch: fewer queries than
        a batch would pack no full batch (under DDP every batch must be full) and train on nothing of them,
        as ToolBench G3's 61 test queries once did in the general recipe's batch of 128. (A whole training
        set smaller than a batch is refused instead, naming ``data.batch_size``, or ``data.max_queries_per_tool``
        when the cap left it so.)"""
        return queries * -(-self.batch_size // len(queries)) if queries else queries

    def pack(self, order: list[int], rng: random.Random,
             positive: dict[int, int] | None = None) -> list[list[tuple[int, int]]]:
        """Full batches of (query, positive tool) from the queries ``order``, in a seeded random order.

        Each query goes to the first open batch where one of its gold tools is still absent (its gold
        tools tried in a random order), so a popular tool is the positive at most once a batch and its
        queries fall back to their other tools (first-fit with one fixed tool per query used only 27 %
        of ToolLens an epoch). Queries that fit nowhere wait until the end and then fill batches even
        with a repeated tool: the false-negative mask still keeps those correct, and ``duplicates``
        counts them. Only the last, incomplete batch is dropped. ``positive`` (from ``capped``): each query's
        one positive, fixed, so the cap holds for the positives exactly (a query never falls back to a tool
        that is already at its cap)."""
        rng.shuffle(order)
        if self.lengths is not None:  # length buckets: sort windows of 32 batches by length (still random across)
            w = self.batch_size * 32
            order = [q for s in range(0, len(order), w) for q in sorted(order[s:s + w], key=lambda q: self.lengths[q])]
        if positive is None:
            prefs = {q: rng.sample(self.gold[q], len(self.gold[q])) for q in order}  # gold tools, random order
        else:
            prefs = {q: [positive[q]] for q in order}
        full: list[list[tuple[int, int]]] = []
        open_batches: list[tuple[list[tuple[int, int]], set[int]]] = []
        waiting: list[int] = []
        for q in order:
            for batch, tools in open_batches:
                t = next((t for t in prefs[q] if t not in tools), None)
                if t is not None:
                    batch.append((q, t))
                    tools.add(t)
                    if len(batch) == self.batch_size:
                        full.append(batch)
                        open_batches.remove((batch, tools))
                    break
            else:
                if len(open_batches) < 256:
                    open_batches.append(([(q, prefs[q][0])], {prefs[q][0]}))
                    if self.batch_size == 1:
                        full.append(open_batches.pop()[0])
                else:
                    waiting.append(q)
        rest = [pair for batch, _ in open_batches for pair in batch]
        rest += [(q, prefs[q][0]) for q in waiting]  # no duplicate-free place left: accept a repeated tool
        return full + [rest[i:i + self.batch_size] for i in range(0, len(rest) - self.batch_size + 1, self.batch_size)]

    def __iter__(self) -> Iterator[list[tuple[int, int, int]]]:
        batches = self.plan()[self.skip:]
        self.skip = 0
        yield from batches

    def __len__(self) -> int:
        # the full epoch: after a mid-epoch resume Lightning continues counting from the restored
        # batch index, and the iterator above yields only the batches not yet seen
        return len(self.plan())


class ShuffledBatchSampler(Sampler[list[tuple[int, int]]]):
    """Plain shuffled batches of (query index, draw seed) for tasks that read whole label sets
    (classification, reranking). Deterministic in (seed, epoch); DDP ranks take every W-th batch of
    one global plan (equal counts); ``skip`` drops batches already seen (mid-epoch resume). The
    per-item draw seed lets a collator make random choices (candidate order) reproducibly."""

    def __init__(self, n: int, batch_size: int, seed: int = 0, rank: int = 0, world: int = 1):
        if n <= 0:
            raise ValueError("no training queries")
        self.n, self.batch_size, self.seed, self.rank, self.world = n, batch_size, seed, rank, world
        self.epoch = 0
        self.skip = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def plan(self) -> list[list[tuple[int, int]]]:
        rng = random.Random(self.seed * 1_000_003 + self.epoch)
        order = list(range(self.n))
        rng.shuffle(order)
        items = [(q, rng.randrange(2**31)) for q in order]
        full = [items[i:i + self.batch_size] for i in range(0, self.n - self.batch_size + 1, self.batch_size)]
        if not full:  # fewer queries than one batch: one short batch rather than nothing
            full = [items]
        usable = max(1, len(full) // self.world) * self.world
        return (full * self.world)[:usable][self.rank::self.world]

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        batches = self.plan()[self.skip:]
        self.skip = 0
        yield from batches

    def __len__(self) -> int:
        return len(self.plan())


class _Identity(torch.utils.data.Dataset):
    """The batch sampler yields the items themselves; the collator turns them into tensors."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        return i


def pad_gold(golds: Sequence[Sequence[int]]) -> torch.Tensor:
    """Gold tool indices padded with -1 -> [B, G]."""
    width = max((len(g) for g in golds), default=1) or 1
    out = torch.full((len(golds), width), -1, dtype=torch.long)
    for i, g in enumerate(golds):
        out[i, : len(g)] = torch.tensor(list(g), dtype=torch.long)
    return out


def token_ids(tokenizer, texts: Sequence[str], max_length: int) -> list[list[int]]:
    """Token ids of every text (special tokens added, truncated to ``max_length``), no padding."""
    return tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"] if texts else []


def pad_ids(rows: Sequence[Sequence[int]], pad: int) -> dict[str, torch.Tensor]:
    """Token id lists -> input_ids and attention_mask [B, longest] (dynamic padding, on the right)."""
    width = max((len(r) for r in rows), default=1)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, :len(r)] = 1
    return {"input_ids": ids, "attention_mask": mask}


class ContrastiveCollator:
    """(query, positive, hard negative) triples -> tokenized queries and documents.

    Documents are the B positives, then the B hard negatives when there are any."""

    def __init__(self, tokenizer, query_texts: list[str], tool_texts: list[str], gold: list[list[int]],
                 max_query_length: int, max_tool_length: int, tokenize: bool = True):
        self.tok, self.query_texts, self.tool_texts, self.gold = tokenizer, query_texts, tool_texts, gold
        self.max_q, self.max_d = max_query_length, max_tool_length
        self.tokenize = tokenize  # False: indices only (the task reads cached activations)
        self._ids: tuple[list[list[int]], list[list[int]]] | None = None

    def __call__(self, triples: list[tuple[int, int, int]]) -> dict[str, Any]:
        queries = [q for q, _, _ in triples]
        docs = [t for _, t, _ in triples]
        if triples and triples[0][2] >= 0:
            docs += [h for _, _, h in triples]
        out = {
            "query_index": torch.tensor(queries, dtype=torch.long),  # [B] training query rows
            "doc_tools": torch.tensor(docs, dtype=torch.long),  # [M] tool index of each doc column
            "positive": torch.arange(len(triples), dtype=torch.long),  # [B] column of each positive
            "gold": pad_gold([self.gold[i] for i in queries]),  # [B, G]
        }
        if not self.tokenize:
            return out
        if self._ids is None:  # every text tokenized once; later batches and epochs only pad
            self._ids = (token_ids(self.tok, self.query_texts, self.max_q), token_ids(self.tok, self.tool_texts, self.max_d))
        pad = self.tok.pad_token_id or 0
        return {**out, "query": pad_ids([self._ids[0][i] for i in queries], pad),
                "doc": pad_ids([self._ids[1][i] for i in docs], pad)}


class QueryCollator:
    """Evaluation batches: tokenized queries and their padded gold tool indices."""

    def __init__(self, tokenizer, max_query_length: int):
        self.tok, self.max_q = tokenizer, max_query_length

    def __call__(self, items: list[tuple[str, list[int]]]) -> dict[str, Any]:
        q = self.tok([t for t, _ in items], padding=True, truncation=True, max_length=self.max_q, return_tensors="pt")
        return {"query": {k: v for k, v in q.items() if k in ("input_ids", "attention_mask")},
                "gold": pad_gold([g for _, g in items]), "texts": [t for t, _ in items]}


class LabelCollator:
    """(query index, draw seed) items -> tokenized queries, padded gold tool indices and the seeds."""

    def __init__(self, tokenizer, query_texts: list[str], gold: list[list[int]], max_query_length: int,
                 tokenize: bool = True):
        self.tok, self.query_texts, self.gold, self.max_q = tokenizer, query_texts, gold, max_query_length
        self.tokenize = tokenize  # False: indices only (the task reads cached activations)

    def __call__(self, items: list[tuple[int, int]]) -> dict[str, Any]:
        idx = [q for q, _ in items]
        out = {"gold": pad_gold([self.gold[i] for i in idx]), "index": torch.tensor(idx, dtype=torch.long),
               "seeds": [s for _, s in items]}
        if self.tokenize:
            q = self.tok([self.query_texts[i] for i in idx], padding=True, truncation=True, max_length=self.max_q,
                         return_tensors="pt")
            out["query"] = {k: v for k, v in q.items() if k in ("input_ids", "attention_mask")}
        return out


class ResumableDataModule(L.LightningDataModule):
    """Training batches from a seeded, rank-sharded batch sampler, with mid-epoch resume: the
    checkpoint records how many batches of the epoch were consumed and the resumed epoch skips
    them. Subclasses give ``train_size``, ``train_sampler`` and ``train_collator``."""

    seed: int = 0
    num_workers: int = 0

    def __init__(self) -> None:
        super().__init__()
        self._train_sampler: Sampler | None = None
        self._skip = 0

    def _rank_world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    @abstractmethod
    def train_size(self) -> int: ...

    @abstractmethod
    def train_sampler(self, rank: int, world: int) -> Sampler: ...

    @abstractmethod
    def train_collator(self) -> Any: ...

    def train_dataloader(self) -> DataLoader:
        rank, world = self._rank_world()
        sampler = self.train_sampler(rank, world)
        if self.trainer is not None:
            sampler.set_epoch(self.trainer.current_epoch)
        sampler.skip, self._skip = self._skip, 0
        self._train_sampler = sampler
        return DataLoader(_Identity(self.train_size()), batch_sampler=sampler, collate_fn=self.train_collator(),
                          num_workers=self.num_workers, generator=self._generator())

    def _generator(self) -> torch.Generator:
        # each DataLoader iterator draws a base seed; from the global RNG that would shift dropout
        # masks depending on when loaders were (re)created, and break exact resume
        return torch.Generator().manual_seed(self.seed)

    def state_dict(self) -> dict[str, Any]:
        trainer = getattr(self, "trainer", None)
        # "processed", not "completed": the checkpoint is written in on_train_batch_end, after the
        # optimizer step of this batch but before Lightning counts it as completed
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed if trainer is not None else 0
        return {"batches_done": int(done)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._skip = int(state.get("batches_done", 0))


class ToolTextDataModule(ResumableDataModule):
    """Serves a ToolDataset to encoder tasks. ``tools`` (sorted by id) fixes the tool indices.
    ``query_prefix`` / ``tool_prefix`` go before every query / tool text the model sees (training and
    in-training evaluation); the dataset itself is left as it is."""

    def __init__(self, dataset: ToolDataset, cfg: TextDataConfig, tokenizer, tool_texts: list[str] | None = None,
                 tool_text_style: str = "default", hard_negatives: list[list[int]] | None = None, seed: int = 0,
                 query_prefix: str = "", tool_prefix: str = ""):
        super().__init__()
        self.ds, self.cfg, self.tok, self.seed = dataset, cfg, tokenizer, seed
        self.num_workers = cfg.num_workers
        self.tools: list[Tool] = sorted(dataset.tools, key=lambda t: natural_key(t.id))
        self.tool_index = {t.id: i for i, t in enumerate(self.tools)}
        self.tool_texts = tool_texts or [tool_prefix + t.document(tool_text_style) for t in self.tools]
        self.query_prefix = query_prefix
        self.train_queries = dataset.split("train")
        self.train_gold = [[self.tool_index[t] for t in q.tools] for q in self.train_queries]
        self.hard_negatives = hard_negatives
        self.tokenize_train = True  # False: training batches carry indices only (cached activations)

    @property
    def train_query_texts(self) -> list[str]:
        """The training queries as the model sees them (with ``query_prefix``)."""
        return [self.query_prefix + q.text for q in self.train_queries]

    # ---- training batches: subclasses override these two hooks ------------------------------
    def train_size(self) -> int:
        return len(self.train_queries)

    def train_sampler(self, rank: int, world: int) -> Sampler:
        lengths = None
        if self.cfg.bucket_by_length:
            lengths = [len(x) for x in token_ids(self.tok, self.train_query_texts, self.cfg.max_query_length)]
        return ContrastiveBatchSampler(self.train_gold, self.cfg.batch_size, self.seed, rank, world,
                                       self.hard_negatives, lengths, self.train_groups(), self.cfg.mixture_temperature,
                                       pinned_groups(self.ds), self.cfg.max_queries_per_tool)

    def train_groups(self) -> list[int] | None:
        """A mixture's training queries by source dataset (the ``dataset::`` prefix of their ids), so
        that each batch comes from one dataset; None for a single dataset."""
        return source_groups(self.ds, [q.id for q in self.train_queries])

    def train_collator(self) -> Any:
        return ContrastiveCollator(self.tok, self.train_query_texts, self.tool_texts, self.train_gold,
                                   self.cfg.max_query_length, self.cfg.max_tool_length, self.tokenize_train)

    def _eval_loader(self, split: str) -> DataLoader:
        rank, world = self._rank_world()
        queries = self.ds.split(split)[rank::world]  # shard by rank; metric states are summed
        items = sorted(((self.query_prefix + q.text, [self.tool_index[t] for t in q.tools]) for q in queries), key=lambda x: len(x[0]))
        return DataLoader(items, batch_size=self.cfg.eval_batch_size, shuffle=False,
                          collate_fn=QueryCollator(self.tok, self.cfg.eval_max_query_length),
                          num_workers=self.cfg.num_workers, generator=self._generator())

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.cfg.val_split)

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader(self.cfg.test_split)


class LabelDataModule(ToolTextDataModule):
    """Shuffled query batches with their whole gold sets (MLC, rerankers) instead of
    (query, positive tool) pairs."""

    def train_sampler(self, rank: int, world: int) -> Sampler:
        return ShuffledBatchSampler(len(self.train_queries), self.cfg.batch_size, self.seed, rank, world)

    def train_collator(self) -> Any:
        return LabelCollator(self.tok, self.train_query_texts, self.train_gold, self.cfg.max_query_length,
                             self.tokenize_train)
