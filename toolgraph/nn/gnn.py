"""Graph encoders over the query–tool–agent graph (plain torch + PyG; no Lightning).

Every encoder maps text features ``x_dict`` (node type -> [n, D]) and ``edge_index_dict`` (edge
type -> [2, E]) to node embeddings of the same node types. The variants differ only in the layer
they build (PyG's ``BasicGNN`` idea):

* ``lightgcn`` — LightGCN (He et al., SIGIR'20): parameter-free ``LGConv`` propagation over the
  homogeneous graph, output = mean of the layer outputs. Text-initialised: layer 0 is
  ``x + x W_type`` with ``W_type`` zero-initialised, so the untrained model is pure propagation of
  the text embeddings (what LoSemB uses) and training learns a residual per node type instead of
  per-node ID embeddings, which could not score a node that was never seen.
* ``gat`` / ``sage`` — a homogeneous stack of ``GATConv`` / ``SAGEConv`` layers with a linear skip,
  turned heterogeneous by ``torch_geometric.nn.to_hetero`` (one weight set per edge type). The
  skip keeps an isolated node (a new query, an unseen tool) a function of its own text.

The node and edge types are fixed (``METADATA``); a dataset without agents or dependencies simply
has empty tensors for them, so a model is built without seeing data (checkpoints rebuild it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn
from torch_geometric.nn import GATConv, LGConv, SAGEConv, to_hetero

NODE_TYPES = ("query", "tool", "agent")
INVOKES = ("query", "invokes", "tool")
EDGE_TYPES = (
    INVOKES, ("tool", "rev_invokes", "query"),
    ("tool", "depends_on", "tool"), ("tool", "rev_depends_on", "tool"),
    ("tool", "belongs_to", "agent"), ("agent", "rev_belongs_to", "tool"),
)
METADATA = (list(NODE_TYPES), list(EDGE_TYPES))
GNNS = ("lightgcn", "gat", "sage")

EdgeDict = dict[tuple[str, str, str], torch.Tensor]


class GraphEncoder(nn.Module, ABC):
    """Base: ``forward(x_dict, edge_index_dict) -> {node type: [n, out_dim]}``."""

    def __init__(self, dim: int, layers: int):
        super().__init__()
        self.dim, self.layers = dim, layers

    def fit_features(self, x: torch.Tensor) -> None:  # noqa: B027 - optional hook
        """See the training features [n, D] once before training (input standardisation)."""

    @abstractmethod
    def forward(self, x_dict: dict[str, torch.Tensor], edge_index_dict: EdgeDict) -> dict[str, torch.Tensor]: ...


class LightGCNEncoder(GraphEncoder):
    """E = 1/(L+1) sum_l E^(l), E^(l+1) = D^-1/2 A D^-1/2 E^(l), E^(0) = X + X W_type (eq. 3-5 of LoSemB)."""

    def __init__(self, dim: int, layers: int):
        super().__init__(dim, layers)
        self.adapt = nn.ModuleDict({t: nn.Linear(dim, dim, bias=False) for t in NODE_TYPES})
        for lin in self.adapt.values():
            nn.init.zeros_(lin.weight)
        self.conv = LGConv(normalize=True)

    def layer0(self, x_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {t: x + self.adapt[t](x) for t, x in x_dict.items()}

    def forward(self, x_dict: dict[str, torch.Tensor], edge_index_dict: EdgeDict) -> dict[str, torch.Tensor]:
        h0 = self.layer0(x_dict)
        types = [t for t in NODE_TYPES if t in h0]
        offset, start = {}, 0
        for t in types:
            offset[t] = start
            start += h0[t].shape[0]
        x = torch.cat([h0[t] for t in types])  # [N_all, D]
        edges = [ei + torch.tensor([[offset[s]], [offset[d]]], device=ei.device)
                 for (s, _, d), ei in edge_index_dict.items() if s in offset and d in offset and ei.numel()]
        edge_index = torch.cat(edges, 1) if edges else torch.zeros(2, 0, dtype=torch.long, device=x.device)
        out, h = x, x
        for _ in range(self.layers):
            h = self.conv(h, edge_index)  # [N_all, D]; isolated nodes get 0
            out = out + h
        out = out / (self.layers + 1)
        return {t: out[offset[t]: offset[t] + h0[t].shape[0]] for t in types}


class _Stack(nn.Module):
    """Homogeneous conv stack with a linear skip per layer; ``to_hetero`` copies it per type."""

    def __init__(self, convs: list[nn.Module], skips: list[nn.Module], dropout: float):
        super().__init__()
        self.convs, self.skips = nn.ModuleList(convs), nn.ModuleList(skips)
        self.dropout = nn.Dropout(dropout)  # a module: FX tracing would bake a functional's training flag

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for i, (conv, skip) in enumerate(zip(self.convs, self.skips, strict=True)):
            x = conv(x, edge_index) + skip(x)
            if i < len(self.convs) - 1:
                x = self.dropout(torch.relu(x))
        return x


class HeteroEncoder(GraphEncoder):
    """A ``_Stack`` of ``make_conv`` layers made heterogeneous by ``to_hetero`` (sum over edge types)."""

    def __init__(self, dim: int, layers: int, hidden: int = 256, heads: int = 4, dropout: float = 0.1):
        super().__init__(dim, layers)
        self.hidden, self.heads = hidden, heads
        dims = [dim] + [hidden] * layers
        convs = [self.make_conv(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True)]
        skips = [nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True)]
        self.net = to_hetero(_Stack(convs, skips, dropout), METADATA, aggr="sum")
        # sentence embeddings share one dominant direction (tiny per-dimension spread); learned layers
        # train far better on standardised inputs. Buffers: saved with the weights, fixed after fit.
        self.register_buffer("center", torch.zeros(dim))
        self.register_buffer("scale", torch.ones(dim))

    def fit_features(self, x: torch.Tensor) -> None:
        self.center.copy_(x.mean(0))
        self.scale.copy_(x.std(0).clamp_min(1e-6))

    @abstractmethod
    def make_conv(self, d_in: int, d_out: int) -> nn.Module:
        """The one layer a variant builds (d_in -> d_out, bipartite-capable)."""

    def forward(self, x_dict: dict[str, torch.Tensor], edge_index_dict: EdgeDict) -> dict[str, torch.Tensor]:
        x_all = {t: (x_dict[t] - self.center) / self.scale if t in x_dict else _empty(x_dict, self.dim)
                 for t in NODE_TYPES}
        e_all = {e: edge_index_dict.get(e, _no_edges(x_dict)) for e in EDGE_TYPES}
        out = self.net(x_all, e_all)
        return {t: out[t] for t in x_dict}


class GATEncoder(HeteroEncoder):
    def make_conv(self, d_in: int, d_out: int) -> nn.Module:
        if d_out % self.heads:
            raise ValueError(f"model.hidden={d_out} must be divisible by model.heads={self.heads}")
        return GATConv((d_in, d_in), d_out // self.heads, heads=self.heads, add_self_loops=False)


class SAGEEncoder(HeteroEncoder):
    def make_conv(self, d_in: int, d_out: int) -> nn.Module:
        return SAGEConv((d_in, d_in), d_out, aggr="mean")


def _empty(x_dict: dict[str, torch.Tensor], dim: int) -> torch.Tensor:
    ref = next(iter(x_dict.values()))
    return ref.new_zeros(0, dim)


def _no_edges(x_dict: dict[str, torch.Tensor]) -> torch.Tensor:
    ref = next(iter(x_dict.values()))
    return torch.zeros(2, 0, dtype=torch.long, device=ref.device)


def build_gnn(kind: str, dim: int, layers: int, hidden: int = 256, heads: int = 4, dropout: float = 0.1) -> GraphEncoder:
    if kind == "lightgcn":
        return LightGCNEncoder(dim, layers)
    if kind == "gat":
        return GATEncoder(dim, layers, hidden, heads, dropout)
    if kind == "sage":
        return SAGEEncoder(dim, layers, hidden, heads, dropout)
    raise ValueError(f"model.gnn must be one of {GNNS}, got {kind!r}")
