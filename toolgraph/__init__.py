"""toolgraph: train, evaluate and serve tool retrievers for LLM agents.

    import toolgraph
    retriever = toolgraph.load("runs/bi_encoder_toollens")      # a run folder, .ckpt, saved retriever or config
    retriever.retrieve(["book a flight to Rome"], k=5)
"""

__version__ = "0.1.0"


def load(path):
    """A Retriever from a checkpoint, an exported retriever folder, a run folder or a config
    (see ``toolgraph.retrieval.loading``). The package itself imports nothing until asked."""
    from toolgraph.retrieval.loading import load as _load

    return _load(path)
