"""The MLC head as a Retriever: a query's score for a tool is the head's logit for it.

The head has one output per tool it was trained with (``head_tools``). A tool indexed later has
no output: it cannot be scored by the head. ``unseen: bottom`` (default) ranks such tools after
every scored tool (in id order) and lists them in ``unscored``; ``unseen: error`` refuses to index
them. To rank new tools properly, fuse the MLC with a dense retriever (``name: fusion``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from safetensors.torch import save_file

from toolgraph.config import TextEncoderSpec, accepts_renamed, encoder_spec
from toolgraph.data.formats import read_json
from toolgraph.errors import DataError
from toolgraph.nn.storage import read_matrix, read_tensors
from toolgraph.registry import RETRIEVERS
from toolgraph.retrieval.dense import DenseConfig, DenseRetriever

UNSCORED = -1.0e9  # below any logit; a finite number so rankings stay valid JSON


@accepts_renamed
@dataclass
class ClassifierRetrieverConfig(DenseConfig):
    name: str = "mlc"
    # the fine-tuned encoder folder (relative to the saved retriever); the head reads unnormalised vectors
    encoder: TextEncoderSpec = field(default_factory=encoder_spec(name="encoder", normalize=False))
    unseen: Literal["bottom", "error"] = "bottom"  # tools the head has no output for: ranked last, or an error


@RETRIEVERS.register("mlc")
class ClassifierRetriever(DenseRetriever):
    Config = ClassifierRetrieverConfig
    name = "mlc"

    def __init__(self, config: ClassifierRetrieverConfig | None = None, encoder=None, tokenizer=None,
                 head: torch.nn.Linear | None = None, head_tools: list[str] | None = None):
        super().__init__(config, encoder=encoder, tokenizer=tokenizer)
        self.weight = head.weight.detach().cpu().clone() if head is not None else torch.zeros(0, 0)  # [T, H]
        self.bias = head.bias.detach().cpu().clone() if head is not None else torch.zeros(0)  # [T]
        self.head_tools = list(head_tools or [])
        self.unscored: list[str] = []
        self._cols = torch.zeros(0, dtype=torch.long)

    def _build(self) -> None:
        pos = {t: i for i, t in enumerate(self.head_tools)}
        self._cols = torch.tensor([pos.get(t.id, -1) for t in self.tools], dtype=torch.long)  # [N]
        self.unscored = [t.id for t in self.tools if t.id not in pos]
        if self.unscored and self.config.unseen == "error":
            raise DataError(f"the MLC head has no output for {len(self.unscored)} tool(s), e.g. "
                            f"{self.unscored[:3]}; retrain, set retriever.unseen=bottom, or fuse with a dense retriever")

    def score(self, queries: list[str]) -> torch.Tensor:
        logits = self.encode_queries(queries) @ self.weight.T + self.bias  # [Q, T]
        known = self._cols >= 0
        out = torch.full((len(queries), len(self.tools)), UNSCORED)
        out[:, known] = logits[:, self._cols[known]]
        return out  # [Q, N]

    def _save_state(self, folder: Path) -> None:
        save_file({"weight": self.weight.contiguous(), "bias": self.bias.contiguous()}, str(folder / "head.safetensors"))
        (folder / "head_tools.json").write_text(json.dumps(self.head_tools) + "\n")
        self._save_encoder(folder)

    def _load_state(self, folder: Path) -> None:
        self._base_dir = folder
        self._check_encoder_folder()
        path = folder / "head.safetensors"
        head = read_tensors(path)
        self.head_tools = read_json(folder / "head_tools.json")
        if not isinstance(self.head_tools, list) or not all(isinstance(t, str) for t in self.head_tools):
            raise DataError("expected a JSON list of tool ids; re-save the retriever", folder / "head_tools.json")
        if "weight" not in head or "bias" not in head:
            raise DataError(f"expected tensors 'weight' and 'bias', found {sorted(head)[:5]}; re-save the retriever", path)
        self.weight, self.bias = head["weight"], head["bias"]
        n = len(self.head_tools)
        if self.weight.dim() != 2 or self.weight.shape[0] != n or tuple(self.bias.shape) != (n,):
            raise DataError(f"the head has {self.weight.shape[0] if self.weight.dim() else 0} outputs (weight "
                            f"{list(self.weight.shape)}, bias {list(self.bias.shape)}) for {n} tools in "
                            "head_tools.json: the files come from different saves; re-save the retriever", path)
        self.weight = read_matrix(path, "weight", n, "tools in head_tools.json", head,  # float32, as wide as the encoder
                                  width=self._encoder_width(), width_of="the encoder's")
        self.bias = self.bias.float()
        self._build()
