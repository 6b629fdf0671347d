"""Dense retrieval over any Hugging Face encoder (bi-encoder / "EmbSim").

Tool and query vectors come from one ``TextEncoder`` (mean or CLS pooling, L2-normalised by
default); scores are inner products. Search is exact (a matmul + deterministic top-k in torch)
or a FAISS index for large corpora. Every vector goes through an :class:`EmbeddingCache`, so
re-evaluating an unchanged model encodes nothing, and ``add_tools`` encodes only new tools.
"""

from __future__ import annotations

import json
import shutil
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from safetensors.torch import save_file

from toolgraph.config import QuerySplit, TextEncoderSpec, ToolText, accepts_renamed, bounded, encoder_spec
from toolgraph.errors import ConfigError, DataError, ModelNotFoundError
from toolgraph.nn.encoder import _MINILM as _NAMED
from toolgraph.nn.encoder import (
    GENERAL,
    TextEncoder,
    check_encoder_folder,
    load_backbone,
    model_in_use,
    model_prompts,
    resolve_model,
)
from toolgraph.nn.storage import check_width, read_matrix
from toolgraph.registry import RETRIEVERS
from toolgraph.retrieval.ann import AnnConfig, AnnIndex
from toolgraph.retrieval.base import Retriever, RetrieverConfig, natural_key
from toolgraph.retrieval.cache import EmbeddingCache
from toolgraph.retrieval.chunks import CHUNK, encode_in_chunks, rank_and_world
from toolgraph.retrieval.delta import Delta, Merge, read_delta
from toolgraph.retrieval.encode import encode_texts
from toolgraph.retrieval.steps import blend_piece_hits, scored_texts, split_scores

_UNCACHED = threading.local()
_STREAM = threading.local()


@contextmanager
def streaming_to(folder: str | Path):
    """In this block, in this thread, ``DenseRetriever`` encodes the tool documents it has no vector
    for in resumable chunks under ``folder`` (retrieval/chunks.py) instead of the embedding cache:
    ``index sync`` puts them beside the index, so a sync killed mid-way resumes where it stopped."""
    before = getattr(_STREAM, "folder", None)
    _STREAM.folder = Path(folder)
    try:
        yield
    finally:
        _STREAM.folder = before


@contextmanager
def embedding_cache_off():
    """In this block, in this thread only, ``DenseRetriever.embed`` encodes without the embedding
    cache: nothing is read from or written to ``cache_dir`` and nothing is kept in memory. The
    server (``toolgraph serve``) answers every request inside it, so query vectors never reach the
    disk; a thread switch also covers members built lazily on first use (an agent index's dense
    encoder, a graph retriever's text embedder), which a walk over the loaded objects would miss."""
    before = getattr(_UNCACHED, "on", False)
    _UNCACHED.on = True
    try:
        yield
    finally:
        _UNCACHED.on = before


SAVED_ENCODER = "encoder"  # where a saved retriever keeps a model folder copied from outside

# the keys of a graph retriever's node text before it became one TextEncoderSpec (issue 42); the old
# ``encoder: <name>`` string is the spec's shorthand
NODE_TEXT_KEYS = {"max_tool_length": "encoder.max_length", "max_query_length": "encoder.max_query_length",
                  "cache_dir": "encoder.cache_dir"}


# the keys of DenseConfig before its encoder became one TextEncoderSpec (issue 42): old checkpoints,
# retriever.json files and YAML keep loading through this table (config.py, renamed keys)
ENCODER_KEYS = {"model": "encoder.name", "pooling": "encoder.pooling", "normalize": "encoder.normalize",
                "max_length": "encoder.max_length", "query_max_length": "encoder.max_query_length",
                "query_prefix": "encoder.query_prefix", "doc_prefix": "encoder.doc_prefix",
                "cache_dir": "encoder.cache_dir"}


@accepts_renamed
@dataclass
class DenseConfig(RetrieverConfig):
    name: str = "dense"
    encoder: TextEncoderSpec = field(default_factory=TextEncoderSpec)  # model, pooling, lengths, prefixes, cache
    batch_size: int = bounded(64, ge=1)
    # exact: torch matmul + top-k; faiss: IndexFlatIP; faiss-hnsw / faiss-ivf: approximate (retrieval/ann.py);
    # auto: exact up to ann.auto_above tools, then ann.auto_kind
    index: Literal["exact", "faiss", "faiss-hnsw", "faiss-ivf", "auto"] = "exact"
    ann: AnnConfig = field(default_factory=AnnConfig)
    chunk_size: int = bounded(CHUNK, ge=1)  # tools per resumable chunk when index sync encodes (retrieval/chunks.py)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    progress: bool = True
    # each request split into pieces (sentences, or clauses: sentences and "then" / "also" parts), each
    # piece scored, a tool's score its best piece's (retrieval/steps.py); none: the request as one text
    query_split: QuerySplit = "none"
    # with a split: the whole request's score weighs this much beside the best piece's
    # (whole * request + (1 - whole) * best piece); 0: the best piece alone
    query_split_whole: float = bounded(0.0, ge=0.0, le=1.0)
    # with a split: each piece's own best tool is raised above the rest, so every piece has a place at the
    # top (a piece whose best match scores below another piece's runners-up is not crowded out)
    query_split_cover: bool = False

    renamed: ClassVar[dict[str, str]] = ENCODER_KEYS


@RETRIEVERS.register("dense")
class DenseRetriever(Retriever):
    Config = DenseConfig
    name = "dense"

    def __init__(self, config: DenseConfig | None = None, encoder: TextEncoder | None = None, tokenizer=None):
        super().__init__(config)
        self._encoder, self._tokenizer = encoder, tokenizer
        self._prompts: dict[str, str] | None = {} if encoder is not None else None  # an in-memory encoder has no folder
        self._cache: EmbeddingCache | None = None
        self._base_dir: Path | None = None  # a saved folder: relative model paths resolve against it
        self._cached_model: str | None = None  # a saved folder's Hugging Face name: its local cache folder
        self._model_source: Path | None = None  # while saving: a model folder from outside to copy in
        self.tool_vectors = torch.zeros(0, 0)
        self._indexed: list = []  # the tools the rows of tool_vectors were encoded from (reused by _build)
        self._indexed_by: str | None = None  # the fingerprint of the encoder that encoded them
        self.encoded = 0  # documents the last index / add_tools / remove_tools encoded (the rest kept their vectors)
        self._raw = torch.zeros(0, 0)  # their vectors as the encoder gave them (tool_vectors, unless a subclass
        # changes them after encoding)
        self._ann: AnnIndex | None = None
        # while loading a folder with a delta (retrieval/delta.py): it, how it merges, the base's ids
        self._delta: tuple[Delta, Merge, list[str]] | None = None

    @classmethod
    def for_encoding(cls, folder: str | Path) -> DenseRetriever:
        """The retriever saved in ``folder`` with its config and encoder but none of its tools: what
        ``index sync`` encodes a few new tools with, without reading a million saved ones."""
        folder = Path(folder)
        meta = json.loads((folder / "retriever.json").read_text(encoding="utf-8"))
        r = cls(cls.parse_config(meta["config"], f"{folder / 'retriever.json'}: config"))
        r._base_dir, r._prompts = folder, None
        r._check_encoder_folder()
        return r

    def encode_tools(self, tools: list) -> torch.Tensor:
        """[len(tools), H]: the vectors indexing ``tools`` gives them (each distinct document encoded once;
        in chunks inside ``streaming_to``)."""
        docs = [self.prefix("document") + d for d in self.documents(tools)]
        distinct = list(dict.fromkeys(docs))
        self.encoded = len(distinct)
        if not distinct:
            return torch.zeros(0, self._encoder_width() or 0)
        fresh = self._embed_documents(distinct)
        at = {d: i for i, d in enumerate(distinct)}
        return fresh[[at[d] for d in docs]]

    # ---- encoding ---------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        want = self.config.device
        return torch.device("cuda" if want == "auto" and torch.cuda.is_available() else ("cpu" if want == "auto" else want))

    def _model_name(self) -> str:
        """config.encoder.name, or the folder of that name saved beside this retriever."""
        model = self.config.encoder.name
        if self._base_dir is not None and (self._base_dir / model).is_dir():
            return str(self._base_dir / model)
        if self._base_dir is not None and self._cached_model is not None:
            return self._cached_model  # a saved folder's hub name: the local cache's copy, never a download
        return model

    def prefix(self, kind: Literal["query", "document"]) -> str:
        """The text before each query / tool document: ``encoder.query_prefix`` / ``encoder.doc_prefix``
        when set, else the prompt the model folder declares (``prompts`` in its
        config_sentence_transformers.json, which toolgraph writes for a bi-encoder trained with
        prefixes), else nothing."""
        own = self.config.encoder.query_prefix if kind == "query" else self.config.encoder.doc_prefix
        if own is not None:
            return own
        if self._prompts is None:
            self._prompts = model_prompts(self._model_name())
        return self._prompts.get(kind, "")

    @property
    def encoder(self) -> TextEncoder:
        if self._encoder is None:
            if self._model_name() == GENERAL:  # by name, not a saved folder: recorded as the model it loads, so
                # an index built on the fallback is saved, and served, as MiniLM (nn/encoder.model_in_use)
                self.config = replace(self.config, encoder=replace(self.config.encoder, name=model_in_use(GENERAL)))
            backbone, self._tokenizer = load_backbone(self._model_name())
            self._encoder = TextEncoder(backbone, self.config.encoder.pooling, self.config.encoder.normalize)
        return self._encoder.to(self.device)

    @property
    def cache(self) -> EmbeddingCache:
        if self._cache is None:
            self._cache = EmbeddingCache(self.config.encoder.cache_dir, self.encoder.fingerprint())
        return self._cache

    def embed(self, texts: list[str], what: str = "encoding", max_length: int | None = None) -> torch.Tensor:
        """texts -> [len, H], through the cache (keyed by text and truncation length)."""
        max_length = max_length or self.config.encoder.max_length
        if getattr(_UNCACHED, "on", False):  # embedding_cache_off(): the server encodes without the cache
            return encode_texts(self.encoder, self._tokenizer, texts, self.config.batch_size, max_length,
                                self.device, progress=False)
        found, missing = self.cache.get(texts, max_length)
        out = torch.empty(len(texts), self.encoder.dim)
        for i, v in found.items():
            out[i] = v
        if missing:
            todo = list(dict.fromkeys(texts[i] for i in missing))  # each distinct text once (Tool2Vec repeats
            # a query once per tool it uses: 40k usage texts are 15k queries on ToolLens)
            vecs = encode_texts(self.encoder, self._tokenizer, todo, self.config.batch_size, max_length,
                                self.device, progress=what if self.config.progress else False)
            row = {t: i for i, t in enumerate(todo)}
            out[missing] = vecs[[row[texts[i]] for i in missing]]
            self.cache.put(todo, vecs, max_length)
            self.cache.flush()
        return out

    # ---- index ------------------------------------------------------------------------------
    def index_kind(self, n: int | None = None) -> str:
        """``config.index`` with ``auto`` resolved for ``n`` tools (default: the indexed ones)."""
        n = len(self.tools) if n is None else n
        if self.config.index != "auto":
            return self.config.index
        return self.config.ann.auto_kind if n > self.config.ann.auto_above else "exact"

    def index_vectors(self, tools: list, vectors: torch.Tensor) -> None:
        """Index ``tools`` with vectors this retriever's encoder has already made for their documents
        (``vectors[i]`` is ``tools[i]``'s, e.g. from a chunked build: retrieval/chunks.py); nothing is
        encoded, and later ``add_tools`` / ``remove_tools`` keep these vectors like their own."""
        if len(vectors) != len(tools):
            raise DataError(f"index_vectors: {len(tools)} tools but {len(vectors)} vectors")
        order = sorted(range(len(tools)), key=lambda i: natural_key(tools[i].id))
        self.tools = [tools[i] for i in order]
        if len({t.id for t in self.tools}) != len(self.tools):
            raise DataError("index_vectors: duplicate tool ids")
        self.tool_vectors = self._raw = vectors[order].float().contiguous()
        self._indexed, self._indexed_by, self.encoded = list(self.tools), "saved", 0
        self._ann = None
        self._build_ann(set())

    def _build(self) -> None:
        """Vectors for ``self.tools``: a tool indexed before with every field the same keeps its vector
        when the encoder's weights are the ones that encoded it (their fingerprint), so ``add_tools``,
        ``remove_tools`` and a re-index encode only new or changed tools; the rest are encoded. Then
        the FAISS index, if any, is updated in place (retrieval/ann.py)."""
        now = self.encoder.fingerprint()
        reuse = self._reusable(now)
        keep, todo, docs, distinct = self._plan(self.tools, reuse)
        before = {t.id for t in self._indexed} if reuse else set()
        fresh = self._embed_documents(distinct) if distinct else torch.zeros(0, self._raw.shape[-1])
        at = {d: i for i, d in enumerate(distinct)}
        new = iter(docs)
        width = fresh.shape[-1] if distinct else self._raw.shape[-1]
        vectors = torch.empty(len(self.tools), width)
        source = torch.tensor([-1 if i is None else i for i in keep], dtype=torch.long)  # old row, -1: encoded now
        kept = source >= 0
        if kept.any():
            vectors[kept] = self._raw[source[kept]]
        made = (~kept).nonzero().squeeze(1)
        if len(made):
            vectors[made] = fresh[[at[next(new)] for _ in range(len(made))]]
        changed = {t.id for t in todo if t.id in before}
        self.tool_vectors = self._raw = vectors
        self._indexed, self._indexed_by, self.encoded = list(self.tools), now, len(distinct)
        self._build_ann(changed)

    def _build_faiss(self) -> None:
        """The FAISS index built again over ``tool_vectors``: for subclasses that change every vector after
        encoding (TGR's smoothing, Tool2Vec's usage mix)."""
        self._ann = None
        self._build_ann(set())

    def _reusable(self, now: str) -> bool:
        """The indexed vectors came from the encoder held now (``now``: its weights' fingerprint; vectors
        loaded from a folder or given to ``index_vectors`` are that encoder's), so a re-index may keep them."""
        if self._indexed_by == "saved":
            self._indexed_by = now
        return self._indexed_by == now and len(self._indexed) == len(self._raw)

    def _plan(self, tools: list, reuse: bool) -> tuple[list, list, list[str], list[str]]:
        """For ``tools`` (sorted): (the old row each keeps or None, the tools to encode, their documents,
        those documents once each, in order); ``reuse``: whether the old rows may be kept."""
        before = {t.id: i for i, t in enumerate(self._indexed)} if reuse else {}
        keep = [before.get(t.id) for t in tools]
        keep = [i if i is not None and self._indexed[i] == t else None for i, t in zip(keep, tools, strict=True)]
        todo = [t for t, i in zip(tools, keep, strict=True) if i is None]
        docs = [self.prefix("document") + d for d in self.documents(todo)]
        return keep, todo, docs, list(dict.fromkeys(docs))

    def encode_share(self, tools: list, folder: str | Path, rank: int, world: int) -> None:
        """Rank ``rank`` of ``world`` processes encodes its share of the chunks that indexing ``tools``
        needs, into ``folder`` (the rank-0 process indexes; ``index sync`` under torchrun)."""
        plan = self._plan(sorted(tools, key=lambda t: natural_key(t.id)), self._reusable(self.encoder.fingerprint()))
        self._encode_chunks(plan[3], Path(folder), rank, world)

    def _encode_chunks(self, docs: list[str], folder: Path, rank: int, world: int) -> torch.Tensor | None:
        length = self.config.encoder.max_length
        return encode_in_chunks(docs, lambda part: encode_texts(self.encoder, self._tokenizer, part,
                                                                 self.config.batch_size, length, self.device),
                                folder, f"{self.encoder.fingerprint()}:{length}", self.config.chunk_size, rank, world,
                                progress="encoding tools" if self.config.progress else False)

    def _embed_documents(self, docs: list[str]) -> torch.Tensor:
        folder = getattr(_STREAM, "folder", None)
        if folder is None:
            return self.embed(docs, "encoding tools")
        _, world = rank_and_world()
        return self._encode_chunks(docs, folder, 0, world)  # rank 0: the other ranks' chunks are waited for

    def _build_ann(self, changed: set[str]) -> None:
        kind = self.index_kind()
        if kind == "exact":
            self._ann = None
            return
        if self._ann is None or self._ann.kind != kind:
            self._ann = AnnIndex(kind, self.config.ann)
            self._ann.build(self.tool_vectors, [t.id for t in self.tools])
        else:
            self._ann.update(self.tool_vectors, [t.id for t in self.tools], changed)

    def encode_queries(self, queries: list[str]) -> torch.Tensor:
        texts = [self.prefix("query") + q for q in queries]
        return self.embed(texts, "encoding queries", self.config.encoder.max_query_length)  # [Q, H]

    def score(self, queries: list[str]) -> torch.Tensor:
        return split_scores(lambda texts: self.encode_queries(texts) @ self.tool_vectors.T, queries,
                            self.config.query_split, self.config.query_split_whole,
                            self.config.query_split_cover)  # [Q, N]

    def _search(self, queries: list[str], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._ann is None:
            return super()._search(queries, k)
        if self.config.query_split == "none":
            return self._ann.search(self.encode_queries(queries), k)
        texts = scored_texts(queries, self.config.query_split, self.config.query_split_whole)
        vectors = self.encode_queries([t for ts in texts for t in ts])
        _, indices = self._ann.search(vectors, k)  # each text's hits, then every hit scored exactly and blended
        return blend_piece_hits(vectors, indices, [len(ts) for ts in texts], self.tool_vectors,
                                self.config.query_split_whole, k, self.config.query_split_cover)

    # ---- persistence ------------------------------------------------------------------------
    def _save_state(self, folder: Path) -> None:
        save_file({"tool_vectors": self.tool_vectors.contiguous()}, str(folder / "tool_vectors.safetensors"))
        if self._ann is not None:
            self._ann.save(folder)
        self._save_encoder(folder)

    def save(self, folder: str | Path) -> Path:
        """As ``Retriever.save``; a model given as a path to a folder outside the retriever (another
        run's encoder, ``runs/bi_encoder/retriever/encoder``) is copied in as ``encoder/`` and the saved
        config names that, so the folder loads and re-indexes from anywhere, the run folder moved or gone."""
        source = self._outside_model()
        if source is None or (not source.is_dir() and self._hub_model()):
            return super().save(folder)
        spec = self.config
        if source.is_dir():
            self._model_source = source
            self._prompts = self._prompts if self._prompts is not None else model_prompts(str(source))
        else:  # the folder moved after loading: _save_encoder exports the encoder held in memory
            own = spec.encoder.query_prefix is not None and spec.encoder.doc_prefix is not None
            if self._encoder is None or (self._prompts is None and not own):
                raise ConfigError(f"retriever.encoder.name: {spec.encoder.name} is not a folder (moved or deleted?) and the "
                                  "encoder was never loaded, so the saved retriever could not re-index: give the "
                                  "model's current path")
        self.config = replace(spec, encoder=replace(spec.encoder, name=SAVED_ENCODER))
        try:
            return super().save(folder)
        finally:
            self.config, self._model_source = spec, None

    def _outside_model(self) -> Path | None:
        """The folder ``config.encoder.name`` names when it is a path (not a bare name) outside any saved
        folder, whether or not it is still there."""
        model = self.config.encoder.name
        if ("/" not in model and "\\" not in model) or (self._base_dir is not None and (self._base_dir / model).is_dir()):
            return None
        return Path(model)

    def _hub_model(self) -> bool:
        """``config.encoder.name`` resolves as a Hugging Face name (``org/name`` in the local cache): kept by name."""
        try:
            resolve_model(self.config.encoder.name)
        except ModelNotFoundError:
            return False
        return True

    def _save_encoder(self, folder: Path) -> None:
        """A model named by a folder relative to the saved retriever travels with it (e.g. a loaded
        retriever re-saved as a pipeline's first stage, or an in-memory encoder from a task); one from
        outside (``save``) is copied in."""
        model = self.config.encoder.name
        target = folder / model
        if self._model_source is not None:
            if target.resolve() == self._model_source.resolve():
                return  # saving over the folder the model already sits in
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(self._model_source, target)
            return
        if Path(model).is_absolute() or target.exists():
            return
        if self._base_dir is not None and (self._base_dir / model).is_dir():
            shutil.copytree(self._base_dir / model, target)
        elif self._encoder is not None and "/" not in model and not Path(model).is_dir() and model not in _NAMED:
            from toolgraph.nn.export import export_sentence_transformer

            export_sentence_transformer(self._encoder, self._tokenizer, target, self.config.encoder.max_length,
                                        {k: self.prefix(k) for k in ("query", "document")})

    def _read_tools(self, folder: Path) -> list:
        """The saved tools, and a delta's applied when the folder has one (retrieval/delta.py)."""
        tools = super()._read_tools(folder)
        self._delta = None
        if type(self) is not DenseRetriever:  # only index sync of a plain dense index writes deltas
            return tools
        delta = read_delta(folder)  # its width is checked with the base's, once the encoder folder is
        if delta is None:
            return tools
        merge = Merge.of(tools, delta, folder)
        self._delta = (delta, merge, [t.id for t in tools])
        return merge.tools

    def _load_state(self, folder: Path) -> None:
        self._base_dir = folder
        if self._encoder is None:
            self._prompts = None  # read from the saved folder's encoder
        self._check_encoder_folder()
        path = folder / "tool_vectors.safetensors"
        delta, self._delta = self._delta, None
        if delta is None and path.is_file():
            base_ids = [t.id for t in self.tools]
            self.tool_vectors = read_matrix(path, "tool_vectors", len(self.tools), "tools",
                                            width=self._encoder_width(), width_of="the encoder's")
        elif delta is not None:
            base_ids = delta[2]
            base = read_matrix(path, "tool_vectors", len(base_ids), "tools of tools.jsonl",
                               width=self._encoder_width(), width_of="the encoder's")
            check_width(delta[0].vectors, "tool_vectors", base.shape[1] if len(base) else self._encoder_width(),
                        folder / "delta.safetensors", "tools.jsonl's vectors'")
            self.tool_vectors = delta[1].vectors(base, delta[0].vectors)
            del base
        else:
            self._build()
            return
        if type(self)._build is DenseRetriever._build:  # saved vectors are the encoder's own: reusable
            self._raw, self._indexed, self._indexed_by = self.tool_vectors, list(self.tools), "saved"
        kind = self.index_kind()
        if kind == "exact":
            self._ann = None
            return
        if delta is not None and kind != self.index_kind(len(base_ids)):
            self._ann = None  # the delta crossed index: auto's threshold: built below
        else:
            self._ann = AnnIndex.load(folder, kind, self.config.ann, base_ids)
        if self._ann is None:  # none saved, or built otherwise: build it now
            self._build_ann(set())
        elif delta is not None:  # the delta's rows added, its removed ones masked
            self._ann.update(self.tool_vectors, [t.id for t in self.tools], delta[1].changed)

    def _encoder_width(self) -> int | None:
        """The width of this retriever's query vectors, known without loading the model: the encoder
        in memory, else the ``hidden_size`` in its folder's config.json; None for a model known only
        by name (a mismatch then fails the first query)."""
        if self._encoder is not None:
            return self._encoder.dim
        try:
            width = json.loads((Path(self._model_name()) / "config.json").read_text(encoding="utf-8")).get("hidden_size")
        except (OSError, ValueError, AttributeError):
            return None
        return width if isinstance(width, int) else None

    def _check_encoder_folder(self) -> None:
        """At load: the model of a saved folder is the encoder saved inside it (e.g. ``encoder/``),
        checked from its files now (a folder without its tokenizer fails here instead of ranking every
        query as [UNK]), or a name this machine has without a download (the packaged MiniLM,
        ``toolgraph-general``, the local Hugging Face cache). Loading a folder never reads a model from
        outside it (an absolute path, ``..``, a link out) and never downloads one: toolgraph copies an
        outside encoder in when it saves, so such a name only comes from a hand-made or edited file."""
        base, model = self._base_dir, self.config.encoder.name
        if base is None:
            return
        where = base / "retriever.json"
        path = Path(model)
        if path.is_absolute() or model.startswith("~") or ".." in path.parts or "\\" in model:
            raise DataError(f"retriever.encoder.name {model!r} names a folder outside the saved retriever; loading a "
                            "folder never reads a model from elsewhere. Re-save the retriever (toolgraph copies "
                            "the encoder in as encoder/), or put the encoder inside the folder and name it there",
                            where)
        inside = base / model
        if inside.is_dir():
            if not inside.resolve().is_relative_to(base.resolve()):
                raise DataError(f"retriever.encoder.name {model!r} leads outside the saved retriever (a link to "
                                f"{inside.resolve()}); a saved retriever loads only the encoder inside it", where)
            check_encoder_folder(inside)
            return
        if model in _NAMED or model == GENERAL:
            return
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(model, "config.json")
        except ValueError:  # not a valid repository name (huggingface_hub's HFValidationError)
            cached = None
        if not isinstance(cached, str):
            raise DataError(f"retriever.encoder.name {model!r} is neither a folder inside the saved retriever nor a model "
                            "in the local Hugging Face cache; loading a saved folder never downloads a model. "
                            "Put it in the cache, or re-save the retriever with the encoder inside it", where)
        self._cached_model = str(Path(cached).parent)


@accepts_renamed
@dataclass
class NodeText:
    """How graph node features are made: a frozen text encoder (tool documents cut at
    ``encoder.max_length``, queries at ``encoder.max_query_length``), read through its embedding cache."""

    encoder: TextEncoderSpec = field(default_factory=encoder_spec(max_length=128, max_query_length=128))
    tool_text: ToolText = "default"

    renamed: ClassVar[dict[str, str]] = NODE_TEXT_KEYS


def text_embedder(cfg: Any) -> DenseRetriever:
    """A DenseRetriever used only for its cached ``embed`` (texts -> [n, D]): the text side of the
    graph retrievers and of ``data.graph.build_graph`` (with a bar while it encodes; the server's
    ``embedding_cache_off`` encodes quietly). ``cfg``: a NodeText, or any section with an ``encoder``
    (TextEncoderSpec) and a ``tool_text`` (the gnn and losemb retrievers')."""
    return DenseRetriever(DenseConfig(encoder=cfg.encoder, tool_text=cfg.tool_text))
