"""Dense bi-encoder (ToolBench-IR, Qin et al. ICLR'24; "EmbSim" in LoSemB) trained with InfoNCE.

* in-batch negatives, gathered across DDP ranks with gradients (``nn.losses.gather_with_grad``),
  labels offset by rank;
* no tool is a negative for a query it serves (mask over each query's whole gold set), and the
  batch sampler never puts one tool twice in a batch;
* optional hard negatives mined by BM25 over the training queries, gold tools filtered out;
* ``instret: true`` — "InstRet": each tool document is augmented with training queries that use it.

Fast training (docs/training.md, "Converge"):
* ``loss: full_catalog`` — every query scored against every tool of the training catalog: the tool
  vectors come from the text tower, held in a bank computed without gradient and refreshed every
  ``refresh_every`` steps, with the batch's own tools re-encoded with gradient so the tool side keeps
  learning; ``multi_positive`` makes every gold tool of a query a positive in the same step.
  Tools a split hides from training (inductive protocol) are never in the bank; in a mixture of
  datasets (``data.name: mixture``) a batch comes from one dataset and only its tools are negatives.
* ``freeze_layers: K`` — embeddings and the first K layers frozen; their outputs for every training
  query and tool are computed once (fp16, cached under ``cache_dir``) and training runs the layers
  above only (``nn.frozen``).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from toolgraph.config import TaskConfig, TextDataConfig, ToolText, bounded
from toolgraph.data.schema import Tool, ToolDataset
from toolgraph.data.sources.mixture import source_groups
from toolgraph.data.text import ToolTextDataModule
from toolgraph.errors import ConfigError
from toolgraph.nn.encoder import (
    TextEncoder,
    backbone_artifacts,
    backbone_from_artifacts,
    interpolate_weights,
    load_or_restore,
)
from toolgraph.nn.frozen import PackedStates, cached_states, check_depth, freeze_bottom
from toolgraph.nn.gradcache import grad_cache
from toolgraph.nn.losses import false_negative_mask, full_catalog_nce, gather_no_grad, gather_with_grad, info_nce
from toolgraph.registry import TASKS
from toolgraph.retrieval.bm25 import BM25Config, BM25Retriever
from toolgraph.retrieval.dense import DenseConfig, DenseRetriever
from toolgraph.retrieval.encode import encode_texts
from toolgraph.retrieval.loading import load
from toolgraph.tasks.base import RetrievalTask


@dataclass
class BiEncoderConfig(TaskConfig):
    name: str = "bi_encoder"
    encoder: str = "all-MiniLM-L6-v2"  # HF id or local folder
    pooling: Literal["mean", "cls"] = "mean"
    normalize: bool = True
    shared: bool = True  # one encoder for queries and tools; false = two towers
    temperature: float = bounded(0.05, gt=0)
    tool_text: ToolText = "default"
    gather: bool = True  # in-batch negatives from every rank
    hard_negatives: bool = False  # one mined hard negative per query
    hard_negative_source: str = "bm25"  # bm25, or a saved retriever / checkpoint / run folder
    hard_negative_depth: int = bounded(20, ge=1)  # mine from the source's top-N (gold tools removed)
    instret: bool = False  # augment tool documents with training queries
    instret_queries: int = bounded(3, ge=1)  # queries appended per tool
    loss: Literal["in_batch", "full_catalog"] = "in_batch"  # negatives: the batch's tools, or the whole catalog
    multi_positive: bool = False  # full_catalog: every gold tool of a query is a positive in the same step
    refresh_every: int = bounded(50, ge=1)  # full_catalog: steps between re-encodings of the whole tool bank
    grad_tools: int = bounded(0, ge=0)  # full_catalog: at most this many batch tools with gradient a step (0 = all)
    freeze_layers: int = bounded(0, ge=0)  # embeddings + the first K layers frozen, their outputs cached
    cache_dir: str | None = ".cache/toolgraph"  # cached activations (freeze_layers > 0); None = in memory only
    grad_cache: int = bounded(0, ge=0)  # GradCache: chunks of this many texts (0 = off); single process only
    wise: float | None = bounded(None, ge=0, le=1)  # export alpha*trained + (1-alpha)*pretrained weights (WiSE-FT)
    query_prefix: str = ""  # instruction-style text before every query, e.g. "query: " (training and inference)
    tool_prefix: str = ""  # ... before every tool document, e.g. "tool: "; both saved as the encoder's prompts

    def validate(self):
        if self.multi_positive and self.loss != "full_catalog":
            yield "multi_positive", "needs loss: full_catalog (in-batch negatives have one positive column per query)"


@TASKS.register("bi_encoder")
class BiEncoderTask(RetrievalTask):
    Config = BiEncoderConfig

    def build(self, artifacts: dict[str, Any] | None) -> None:
        m = self.model_cfg
        backbone, self.tokenizer = load_or_restore(m.encoder, artifacts and artifacts["query"])
        self.query_encoder = TextEncoder(backbone, m.pooling, m.normalize)
        if m.shared:
            self.doc_encoder = self.query_encoder
        else:
            doc_backbone = backbone_from_artifacts(artifacts["doc"])[0] if artifacts else copy.deepcopy(backbone)
            self.doc_encoder = TextEncoder(doc_backbone, m.pooling, m.normalize)
        self.tool_vectors: torch.Tensor | None = None
        self.tool_texts: list[str] = []
        self.catalog: list[Tool] = [Tool(**t) for t in artifacts["tools"]] if artifacts else []
        self.automatic_optimization = not m.grad_cache  # GradCache steps the optimizer itself
        if m.freeze_layers:
            for enc in {id(e): e for e in (self.query_encoder, self.doc_encoder)}.values():
                check_depth(enc.backbone, m.freeze_layers)
                freeze_bottom(enc.backbone, m.freeze_layers)
        # fast training state (not saved: rebuilt from the data at the start of every fit)
        self._query_texts: list[str] = []
        self._query_states: PackedStates | None = None
        self._tool_states: PackedStates | None = None
        self._allowed: torch.Tensor | None = None  # [N] tools that may be negatives in training
        self._tool_group: torch.Tensor | None = None  # [N] source dataset of each tool (mixtures)
        self._bank: torch.Tensor | None = None  # [N, H] tool vectors without gradient
        self._bank_step = -1

    # ---- data -----------------------------------------------------------------------------
    def make_datamodule(self, ds: ToolDataset, data_cfg: TextDataConfig, seed: int) -> ToolTextDataModule:
        m = self.model_cfg
        if m.instret:
            ds = instret_augment(ds, m.instret_queries)
        dm = ToolTextDataModule(ds, data_cfg, self.tokenizer, tool_text_style=m.tool_text, seed=seed,
                                query_prefix=m.query_prefix, tool_prefix=m.tool_prefix)
        if m.hard_negatives:
            dm.hard_negatives = mine_hard_negatives(dm, m.hard_negative_source, m.hard_negative_depth, m.tool_text)
        self.tool_texts = dm.tool_texts
        self.catalog = dm.tools
        dm.tokenize_train = not m.freeze_layers  # cached states replace tokens
        self._query_texts = dm.train_query_texts
        hidden = set(ds.notes.get("unseen_tools") or ())  # inductive protocol: never a training negative
        self._allowed = torch.tensor([t.id not in hidden for t in dm.tools], dtype=torch.bool)
        groups = source_groups(ds, [t.id for t in dm.tools])  # a mixture batch's negatives: its own dataset's tools
        self._tool_group = torch.tensor(groups) if groups is not None else None
        return dm

    def on_train_start(self) -> None:
        """Frozen bottom: the hidden states of every training query and tool, computed once (or read
        from ``cache_dir``) on this device, kept in fp16 on the CPU. Built here, inside the training
        time that ``trainer.max_time`` counts, so a budget pays for its cache."""
        m, d = self.model_cfg, self.cfg.data
        self._bank = None
        if m.grad_cache and self.trainer is not None and self.trainer.world_size > 1:
            raise ConfigError(f"model.grad_cache: runs in one process only (this run has {self.trainer.world_size}); "
                              "under DDP raise data.batch_size per rank or use trainer.accumulate_grad_batches")
        if not m.freeze_layers or not self._query_texts:
            return
        from lightning.pytorch.utilities.rank_zero import rank_zero_info

        start = time.perf_counter()
        self._query_states = cached_states(self.query_encoder.backbone, self.tokenizer, self._query_texts,
                                           m.freeze_layers, d.max_query_length, m.cache_dir, d.eval_batch_size,
                                           self.device)
        self._tool_states = cached_states(self.doc_encoder.backbone, self.tokenizer, self.tool_texts, m.freeze_layers,
                                          d.max_tool_length, m.cache_dir, d.eval_batch_size, self.device)
        mb = (self._query_states.nbytes + self._tool_states.nbytes) / 2**20
        rank_zero_info(f"frozen bottom (embeddings + {m.freeze_layers} layers): states of {len(self._query_states)} "
                       f"queries and {len(self._tool_states)} tools, {mb:.0f} MiB fp16, {time.perf_counter() - start:.1f} s")

    # ---- training ---------------------------------------------------------------------------
    def compute_loss(self, batch: dict[str, Any]) -> torch.Tensor:
        encode_q, n_q, encode_d, n_d, loss_fn = self._objective(batch)
        return loss_fn(encode_q(torch.arange(n_q)), encode_d(torch.arange(n_d)))

    def _objective(self, batch: dict[str, Any]) -> tuple[Callable, int, Callable, int, Callable]:
        """The batch's loss as (encode queries(rows), #queries, encode documents(rows), #documents,
        loss(query vectors, document vectors)): ``compute_loss`` runs it at once, GradCache by chunks."""
        m, k = self.model_cfg, self.model_cfg.freeze_layers

        def encode_q(rows: torch.Tensor) -> torch.Tensor:
            if k:
                return self._query_states.encode(self.query_encoder, batch["query_index"][rows], k, self.device)
            return self.query_encoder(**{n: v[rows.to(v.device)] for n, v in batch["query"].items()})

        gold = batch["gold"]  # [B, G]
        if m.loss == "full_catalog":
            if self._bank is None or self.global_step - self._bank_step >= m.refresh_every:
                self._refresh_bank()
            positive = None if m.multi_positive else batch["doc_tools"][batch["positive"]]  # [B] tool rows
            own = torch.unique(gold[gold >= 0] if positive is None else positive)  # the batch's tools, with gradient
            if m.grad_tools and len(own) > m.grad_tools:  # a random subset; the rest come from the bank
                own = own[torch.randperm(len(own), device=own.device)[:m.grad_tools]]
            allowed = self._allowed.to(self.device) if self._allowed is not None else None
            if self._tool_group is not None:  # a mixture batch comes from one dataset: its catalog only
                group = self._tool_group.to(self.device)
                same = group == group[gold[0, 0]]
                allowed = same if allowed is None else allowed & same

            def catalog_loss(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
                self._bank[own] = d.detach().float()  # the freshest vectors stay in the bank
                tools = self._bank.index_copy(0, own, d.float())  # [N, H]: gradient flows into the batch's rows
                return full_catalog_nce(q.float(), tools, gold, m.temperature, positive, allowed)

            return encode_q, gold.shape[0], lambda rows: self._tools(own[rows.to(own.device)]), len(own), catalog_loss

        doc_tools = batch["doc_tools"]

        def encode_d(rows: torch.Tensor) -> torch.Tensor:
            if k:
                return self._tools(doc_tools[rows.to(doc_tools.device)])
            return self.doc_encoder(**{n: v[rows.to(v.device)] for n, v in batch["doc"].items()})

        def in_batch_loss(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
            cols, positive = doc_tools, batch["positive"]
            if m.gather and self.trainer is not None and self.trainer.world_size > 1:
                offset = self.trainer.global_rank * d.shape[0]
                d = gather_with_grad(d)  # [W*M, H]
                cols = gather_no_grad(cols)  # [W*M]
                positive = positive + offset  # this rank's positives sit at its slice
            mask = false_negative_mask(gold, cols, positive)  # [B, W*M]
            return info_nce(q, d, positive, m.temperature, mask)

        return encode_q, gold.shape[0], encode_d, len(doc_tools), in_batch_loss

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        """With ``grad_cache: C`` the step is GradCache (nn.gradcache): chunks of C texts, the gradient
        of the whole batch's loss, optimizer and schedule stepped here (manual optimization)."""
        m = self.model_cfg
        if not m.grad_cache:
            return super().training_step(batch, batch_idx)
        opt, sched = self.optimizers(), self.lr_schedulers()
        opt.zero_grad()
        encode_q, n_q, encode_d, n_d, loss_fn = self._objective(batch)

        def chunks(n: int) -> list[torch.Tensor]:
            return [torch.arange(s, min(n, s + m.grad_cache)) for s in range(0, n, m.grad_cache)]

        loss = grad_cache(loss_fn, [(encode_q, chunks(n_q)), (encode_d, chunks(n_d))],
                          backward=lambda rep, grad: self.manual_backward(rep, grad))
        self.on_before_backward(loss)  # a non-finite loss stops the run before the weights change
        clip = self.cfg.trainer.gradient_clip_val
        if clip:
            self.clip_gradients(opt, gradient_clip_val=clip, gradient_clip_algorithm="norm")
        opt.step()
        sched.step()
        self.log("train/loss", loss, prog_bar=True, batch_size=n_q)
        return loss

    @classmethod
    def manual_optimization(cls, cfg: Any) -> bool:
        return bool(cfg.model.grad_cache)

    def _tools(self, index: torch.Tensor) -> torch.Tensor:
        """Vectors [M, H] of the tools ``index`` (catalog rows), with gradient unless under no_grad."""
        k = self.model_cfg.freeze_layers
        if k:
            return self._tool_states.encode(self.doc_encoder, index, k, self.device)
        t = self.tokenizer([self.tool_texts[i] for i in index.tolist()], padding=True, truncation=True,
                           max_length=self.cfg.data.max_tool_length, return_tensors="pt")
        return self.doc_encoder(input_ids=t["input_ids"].to(self.device), attention_mask=t["attention_mask"].to(self.device))

    def _refresh_bank(self) -> None:
        """Every tool's vector without gradient (eval mode: no dropout) -> the bank [N, H]."""
        was = self.doc_encoder.training
        self.doc_encoder.eval()
        try:
            with torch.no_grad():
                n, step = len(self.tool_texts), self.cfg.data.eval_batch_size
                self._bank = torch.cat([self._tools(torch.arange(s, min(n, s + step))).float()
                                        for s in range(0, n, step)])
        finally:
            self.doc_encoder.train(was)
        self._bank_step = self.global_step

    def finish(self, out: Path, dm: Any, extra: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
        """``wise: alpha``: the weights exported (and tested) are ``alpha * trained + (1 - alpha) *
        model.encoder``'s (WiSE-FT, Wortsman et al., CVPR'22): closer to the pretrained encoder, so
        better on catalogs unlike the training data (benchmarks/general.py chooses alpha on val).
        Checkpoints keep the trained weights."""
        alpha = self.model_cfg.wise
        if alpha is not None and alpha != 1:
            for enc in {id(e): e for e in (self.query_encoder, self.doc_encoder)}.values():
                interpolate_weights(enc.backbone, self.model_cfg.encoder, alpha)
        return super().finish(out, dm, extra)

    # ---- retrieval ----------------------------------------------------------------------------
    def prepare_scoring(self) -> None:
        texts = self.tool_texts or self.trainer.datamodule.tool_texts
        cfg = self.cfg.data
        self.tool_vectors = encode_texts(self.doc_encoder, self.tokenizer, texts, cfg.eval_batch_size,
                                         cfg.max_tool_length, self.device).to(self.device)  # [N, H]

    def score(self, batch: dict[str, Any]) -> torch.Tensor:
        return self.query_encoder(**batch["query"]) @ self.tool_vectors.T  # [B, N]

    # ---- export -------------------------------------------------------------------------------
    def checkpoint_artifacts(self) -> dict[str, Any]:
        out = {"query": backbone_artifacts(self.query_encoder.backbone, self.tokenizer),
               "tools": [{k: v for k, v in vars(t).items() if v is not None} for t in self.catalog]}
        if not self.model_cfg.shared:
            out["doc"] = backbone_artifacts(self.doc_encoder.backbone, self.tokenizer)
        return out

    def as_retriever(self, tools: list[Tool] | None = None) -> Any:
        """The trained encoder as an in-memory DenseRetriever over ``tools`` (default: the catalog)."""
        m, d = self.model_cfg, self.cfg.data
        if not m.shared:
            raise ConfigError("two-tower bi-encoders cannot become a single-encoder DenseRetriever; use shared: true")
        cfg = DenseConfig(model="encoder", pooling=m.pooling, normalize=m.normalize, max_length=d.max_tool_length,
                          query_max_length=d.eval_max_query_length, tool_text=m.tool_text, cache_dir=None,
                          query_prefix=m.query_prefix, doc_prefix=m.tool_prefix)
        r = DenseRetriever(cfg, encoder=copy.deepcopy(self.query_encoder).cpu().eval(), tokenizer=self.tokenizer)
        r.index(self.catalog if tools is None else tools)
        return r

    def exported_encoder(self) -> tuple[TextEncoder, int]:
        return self.query_encoder, self.cfg.data.max_tool_length

    def exported_prompts(self) -> dict[str, str]:
        return {"query": self.model_cfg.query_prefix, "document": self.model_cfg.tool_prefix}


def instret_augment(ds: ToolDataset, n: int) -> ToolDataset:
    """InstRet: append up to ``n`` training queries that use a tool to its description."""
    examples: dict[str, list[str]] = {}
    for q in ds.split("train"):
        for t in q.tools:
            if len(examples.setdefault(t, [])) < n:
                examples[t].append(q.text)
    tools = [Tool(t.id, t.name, f"{t.description} Example requests: " + " | ".join(examples[t.id]), t.agent,
                  t.category, t.parameters, t.returns) if t.id in examples else t for t in ds.tools]
    notes = {**ds.notes, "instret_queries": n, "instret_tools": len(examples)}
    return ToolDataset(ds.name, tools, ds.queries, ds.agents, ds.dependencies, ds.skipped, notes)


def mine_hard_negatives(dm: ToolTextDataModule, source: str, depth: int, tool_text: str) -> list[list[int]]:
    """Per training query, the source's top-``depth`` tools minus its gold tools (false negatives).
    ``source``: "bm25", or anything ``toolgraph.load`` reads (a saved retriever, a checkpoint)."""
    r = BM25Retriever(BM25Config(tool_text=tool_text)) if source == "bm25" else load(source)
    r.index(dm.tools)
    ranking = r.retrieve([q.text for q in dm.train_queries], depth + 8, progress="mining hard negatives")
    out = []
    n = len(dm.tools)
    for ids, gold in zip(ranking.ids, dm.train_gold):
        gold_set = set(gold)
        negs = [dm.tool_index[i] for i in ids if dm.tool_index[i] not in gold_set][:depth]
        out.append(negs or [next(j for j in range(n) if j not in gold_set)])
    return out
