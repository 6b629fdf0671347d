"""One small in-memory retriever of every kind that stores tensors when saved (dense, Tool2Vec,
query neighbours, t2a, MLC, GNN, LoSemB, refiner), built on the tiny random BERT; their saved folders hold everything
they load (exported encoders included), so a test may damage any file of them. Used by
test_no_mmap.py and test_load_checks.py."""

from __future__ import annotations

from pathlib import Path

import torch

from toolgraph.data.schema import Tool

QUERIES = ["weather forecast for tomorrow", "book a flight to rome", "convert dollars to euros"]

TOOLS = [
    Tool("t1", "get_weather", "current weather and forecast for a city", "weather"),
    Tool("t2", "search_flights", "find flights between two airports", "travel"),
    Tool("t3", "book_hotel", "reserve a hotel room in a city", "travel"),
    Tool("t4", "convert_currency", "convert an amount between currencies", "money"),
    Tool("t5", "stock_price", "latest price of a stock ticker", "money"),
    Tool("t6", "air_quality", "air quality index of a city", "weather"),
]

KINDS = ["dense", "tool2vec", "query_knn", "t2a", "mlc", "gnn", "losemb", "refiner"]


def _encoder(tiny_bert_dir: Path, normalize: bool = True):
    from toolgraph.nn.encoder import TextEncoder, load_backbone

    backbone, tok = load_backbone(str(tiny_bert_dir))
    return TextEncoder(backbone, "mean", normalize).eval(), tok


def _dense(tiny_bert_dir: Path, cache_dir: str | None = None, cls_name: str = "dense", **kw):
    """A dense retriever whose encoder lives in memory: saving it exports ``encoder/`` beside it."""
    from toolgraph.registry import RETRIEVERS

    cls = RETRIEVERS.get(cls_name)
    enc, tok = _encoder(tiny_bert_dir)
    cfg = cls.Config(name=cls_name, model="encoder", cache_dir=cache_dir, progress=False, max_length=32, **kw)
    return cls(cfg, encoder=enc, tokenizer=tok)


def build(kind: str, tiny_bert_dir: Path, cache_dir: str | None = None):
    """An indexed retriever of ``kind`` over TOOLS."""
    torch.manual_seed(0)
    ids = [t.id for t in TOOLS]
    if kind == "dense":
        r = _dense(tiny_bert_dir, cache_dir)
    elif kind == "tool2vec":
        r = _dense(tiny_bert_dir, cache_dir, "tool2vec")
        r.usage = {"t1": ["is it going to rain"], "t4": ["how many euros is 10 dollars"]}
    elif kind == "query_knn":
        r = _dense(tiny_bert_dir, cache_dir, "query_knn", neighbors=2)
        r.examples = [("is it going to rain", ["t1", "t6"]), ("how many euros is 10 dollars", ["t4"]),
                      ("a room in paris", ["t3"])]
    elif kind == "t2a":
        from toolgraph.retrieval.agents import AgentRetrieverConfig, ToolToAgentRetriever

        r = ToolToAgentRetriever(AgentRetrieverConfig(name="t2a", scorer="rrf"), dense=_dense(tiny_bert_dir, cache_dir))
    elif kind == "mlc":
        from toolgraph.retrieval.classifier import ClassifierRetriever, ClassifierRetrieverConfig

        enc, tok = _encoder(tiny_bert_dir, normalize=False)  # as the config says
        cfg = ClassifierRetrieverConfig(model="encoder", cache_dir=cache_dir, progress=False, max_length=32)
        r = ClassifierRetriever(cfg, encoder=enc, tokenizer=tok, head=torch.nn.Linear(enc.dim, len(ids)), head_tools=ids)
    elif kind == "gnn":
        from toolgraph.nn.gnn import build_gnn
        from toolgraph.retrieval.gnn import GNNConfig, GNNRetriever

        cfg = GNNConfig(gnn="lightgcn", dim=32, layers=1, hidden=32, encoder=str(tiny_bert_dir), cache_dir=cache_dir)
        r = GNNRetriever(cfg, gnn=build_gnn("lightgcn", 32, 1), graph_tools={i: torch.randn(32) for i in ids[:4]})
    elif kind == "losemb":
        import torch.nn.functional as F

        from toolgraph.retrieval.losemb import LoSemBConfig, LoSemBRetriever

        r = LoSemBRetriever(LoSemBConfig(encoder=str(tiny_bert_dir), cache_dir=cache_dir, top_j=2, top_i=2))
        r.query_x = F.normalize(torch.randn(4, 32), dim=-1)
        r.query_delta = 0.1 * torch.randn(4, 32)
        r.query_tools = [["t1"], ["t2"], ["t4"], ["t1", "t6"]]
        r.seen_delta = {i: 0.1 * torch.randn(32) for i in ("t1", "t2", "t4", "t6")}
        r.n_train = 4
    elif kind == "refiner":
        from toolgraph.nn.encoder import load_backbone
        from toolgraph.nn.rerankers import ToolRefiner
        from toolgraph.retrieval.rerankers import RefinerReranker, RefinerRerankerConfig

        backbone, tok = load_backbone(str(tiny_bert_dir))
        vectors = _dense(tiny_bert_dir, cache_dir)
        r = RefinerReranker(RefinerRerankerConfig(), network=ToolRefiner(backbone, 32).eval(), tokenizer=tok,
                            vectors=vectors)
    else:
        raise ValueError(kind)
    r.index(TOOLS)
    return r


# the tensor file of each saved kind that holds per-tool rows, and the tensor in it
VECTOR_FILES = {
    "dense": ("tool_vectors.safetensors", "tool_vectors"),
    "tool2vec": ("tool_vectors.safetensors", "tool_vectors"),
    "query_knn": ("tool_vectors.safetensors", "tool_vectors"),
    "t2a": ("entity_vectors.safetensors", "tool_vectors"),
    "mlc": ("head.safetensors", "weight"),
    "gnn": ("graph_tools.safetensors", "vectors"),
    "losemb": ("losemb.safetensors", "tool_x"),
    "refiner": ("vectors/tool_vectors.safetensors", "tool_vectors"),
}
