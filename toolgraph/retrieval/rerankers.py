"""Second-stage rerankers as Retrievers: the ToolRefiner and the cross-encoder.

Both score a candidate list per query (``rerank``) and, alone, every indexed tool (``score``).
They save as a folder: ``model/`` (the Hugging Face encoder + tokenizer), ``head.safetensors``
(the layers on top) and, for the refiner, ``vectors/`` (the saved retriever whose tool vectors
feed it: Tool2Vec or description vectors, so new tools get a vector the same way). A refiner trained
with ``learn_tool_vectors`` also keeps one learned offset per training tool (in ``head.safetensors``,
their ids in ``learned_tools``); other tools get their vector alone.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from toolgraph.config import bounded
from toolgraph.data.schema import ToolDataset
from toolgraph.errors import DataError
from toolgraph.nn.encoder import check_encoder_folder, load_backbone
from toolgraph.nn.rerankers import PairScorer, ToolRefiner
from toolgraph.nn.storage import check_width, read_tensors, tensor_header
from toolgraph.registry import RETRIEVERS
from toolgraph.retrieval.base import Retriever, RetrieverConfig
from toolgraph.retrieval.pipeline import BELOW, Reranker


@dataclass
class RerankerConfig(RetrieverConfig):
    model: str = "model"  # the encoder folder (relative to the saved reranker)
    max_length: int = bounded(128, ge=1)  # query tokens (refiner) or pair tokens (cross-encoder)
    batch_size: int = bounded(32, ge=1)  # queries (refiner) or pairs (cross-encoder) per forward pass
    device: str = "auto"


def _device(want: str) -> torch.device:
    return torch.device("cuda" if want == "auto" and torch.cuda.is_available() else ("cpu" if want == "auto" else want))


class _NetworkReranker(Reranker):
    """Shared persistence: the backbone saved as a HF folder, the rest of the network as safetensors."""

    def __init__(self, config=None, network: torch.nn.Module | None = None, tokenizer=None):
        super().__init__(config)
        self.network, self.tokenizer = network, tokenizer
        self._base: Path | None = None

    @abstractmethod
    def _make_network(self, backbone: torch.nn.Module, head: dict[str, torch.Tensor]) -> torch.nn.Module:
        """The network around a loaded backbone (``head``: the saved non-backbone tensors)."""

    def net(self) -> torch.nn.Module:
        if self.network is None:
            path = self._base / self.config.model if self._base is not None else Path(self.config.model)
            backbone, self.tokenizer = load_backbone(str(path))
            head_path = path.parent / "head.safetensors"
            head = read_tensors(head_path)  # in memory: the file may be rewritten under a running server
            try:
                self.network = self._make_network(backbone, head)
                self.network.load_state_dict({**{f"backbone.{k}": v for k, v in backbone.state_dict().items()},
                                              **head})
            except (KeyError, IndexError, RuntimeError) as e:  # missing / unexpected tensors, other shapes
                raise DataError(f"does not fit the {self.name} network ({type(e).__name__}: {str(e)[:300]}); "
                                "re-save the reranker", head_path) from None
        return self.network.to(_device(self.config.device)).eval()

    def _save_state(self, folder: Path) -> None:
        net = self.net()
        net.backbone.save_pretrained(folder / "model", safe_serialization=True)
        self.tokenizer.save_pretrained(folder / "model")
        head = {k: v.detach().cpu().contiguous() for k, v in net.state_dict().items() if not k.startswith("backbone.")}
        save_file(head, str(folder / "head.safetensors"))

    def _load_state(self, folder: Path) -> None:
        self._base = folder
        self.network = None
        if (folder / self.config.model).is_dir():  # the tokenizer is checked now, the weights on first use
            check_encoder_folder(folder / self.config.model)
        if (folder / "head.safetensors").is_file():
            read_tensors(folder / "head.safetensors")  # NaN / inf weights refused at load, not at the first query

    def _saved_config(self):
        c = self.config
        return type(c)(**{**vars(c), "model": "model"})

    def save(self, folder: str | Path) -> Path:
        spec, self.config = self.config, self._saved_config()
        try:
            return super().save(folder)
        finally:
            self.config = spec


@dataclass
class RefinerRerankerConfig(RerankerConfig):
    name: str = "refiner"
    vectors: str = "vectors"  # the saved retriever that gives tool vectors
    slot_layer: int = bounded(0, ge=0)  # the layer the candidate slots join at (ToolRefiner.slot_layer)
    learned_tools: list[str] = field(default_factory=list)  # ids of the rows of ToolRefiner.tool_offsets


@RETRIEVERS.register("refiner")
class RefinerReranker(_NetworkReranker):
    Config = RefinerRerankerConfig
    name = "refiner"

    def __init__(self, config: RefinerRerankerConfig | None = None, network: ToolRefiner | None = None,
                 tokenizer=None, vectors: Retriever | None = None):
        super().__init__(config, network, tokenizer)
        self.vectors = vectors
        self._row: dict[str, int] = {}
        self._offset_row = {t: i for i, t in enumerate(self.config.learned_tools)}

    def _make_network(self, backbone, head):
        return ToolRefiner(backbone, head["project.weight"].shape[1], slot_layer=self.config.slot_layer,
                           learned_tools=len(self.config.learned_tools))

    def fit(self, dataset: ToolDataset) -> None:
        if self.vectors is not None and not getattr(self.vectors, "usage", None):
            self.vectors.fit(dataset)  # a Tool2Vec that was never fitted learns its usage here

    def _build(self) -> None:
        self.vectors.index(self.tools)  # new tools get vectors (Tool2Vec: description fallback)
        self._row = {t.id: i for i, t in enumerate(self.vectors.tools)}

    @torch.inference_mode()
    def rerank(self, queries: list[str], candidates: list[list[str]]) -> torch.Tensor:
        net = self.net()
        device = next(net.parameters()).device
        table = self.vectors.tool_vectors  # [T, D]
        width = max((len(c) for c in candidates), default=0)
        out = torch.full((len(queries), width), BELOW * 10)
        bs = self.config.batch_size
        for lo in range(0, len(queries), bs):
            qs, cs = queries[lo:lo + bs], candidates[lo:lo + bs]
            tok = self.tokenizer(qs, padding=True, truncation=True, max_length=self.config.max_length,
                                 return_tensors="pt")
            n = max(len(c) for c in cs)
            rows = torch.zeros(len(cs), n, dtype=torch.long)
            learned = torch.full((len(cs), n), -1, dtype=torch.long)
            mask = torch.zeros(len(cs), n, dtype=torch.bool)
            for i, c in enumerate(cs):
                rows[i, : len(c)] = torch.tensor([self._row[t] for t in c], dtype=torch.long)
                learned[i, : len(c)] = torch.tensor([self._offset_row.get(t, -1) for t in c], dtype=torch.long)
                mask[i, : len(c)] = True
            vecs = net.tool_inputs(table[rows].to(device), learned.to(device))
            logits = net(tok["input_ids"].to(device), tok["attention_mask"].to(device), vecs,
                         mask.to(device)).float().cpu()  # [b, n]
            out[lo:lo + len(qs), :n] = logits.masked_fill(~mask, BELOW * 10)
        return out

    def _save_state(self, folder: Path) -> None:
        super()._save_state(folder)
        self.vectors.save(folder / "vectors")

    def _load_state(self, folder: Path) -> None:
        super()._load_state(folder)
        self.vectors = Retriever.load(folder / self.config.vectors)
        project = tensor_header(folder / "head.safetensors").get("project.weight")  # [hidden, D]: D = vector width
        table = getattr(self.vectors, "tool_vectors", None)
        if project is not None and table is not None and table.dim() == 2:
            check_width(table, "tool_vectors", project["shape"][-1], folder / self.config.vectors,
                        "the refiner's inputs (project.weight in head.safetensors)")
        self._row = {t.id: i for i, t in enumerate(self.vectors.tools)}
        missing = [t.id for t in self.tools if t.id not in self._row]
        if missing:
            raise DataError(f"{len(self.vectors.tools)} tool vectors for {len(self.tools)} tools: no vector for "
                            f"{missing[:3]}; the vectors retriever comes from another save: re-save the reranker",
                            folder / self.config.vectors)

    def _saved_config(self):
        return RefinerRerankerConfig(**{**vars(self.config), "model": "model", "vectors": "vectors"})


@dataclass
class CrossEncoderRerankerConfig(RerankerConfig):
    name: str = "cross_encoder"
    max_length: int = bounded(192, ge=1)  # query + tool document


@RETRIEVERS.register("cross_encoder")
class CrossEncoderReranker(_NetworkReranker):
    Config = CrossEncoderRerankerConfig
    name = "cross_encoder"

    def _make_network(self, backbone, head):
        return PairScorer(backbone)

    @torch.inference_mode()
    def rerank(self, queries: list[str], candidates: list[list[str]]) -> torch.Tensor:
        net = self.net()
        device = next(net.parameters()).device
        doc = {t.id: t.document(self.config.tool_text) for t in self.tools}
        pairs = [(qi, j) for qi, c in enumerate(candidates) for j in range(len(c))]
        pairs.sort(key=lambda p: len(queries[p[0]]) + len(doc[candidates[p[0]][p[1]]]))  # little padding
        width = max((len(c) for c in candidates), default=0)
        out = torch.full((len(queries), width), BELOW * 10)
        bs = self.config.batch_size
        for lo in range(0, len(pairs), bs):
            chunk = pairs[lo:lo + bs]
            tok = self.tokenizer([queries[q] for q, _ in chunk], [doc[candidates[q][j]] for q, j in chunk],
                                 padding=True, truncation="longest_first", max_length=self.config.max_length,
                                 return_tensors="pt")
            tok = {k: v.to(device) for k, v in tok.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
            logits = net(**tok).float().cpu()  # [P]
            for (q, j), s in zip(chunk, logits.tolist(), strict=True):
                out[q, j] = s
        return out
