"""toolgraph: train, evaluate and serve tool retrievers for LLM agents."""

__version__ = "0.1.0"


def load(path):
    """A Retriever from a checkpoint, an exported retriever folder or a run folder."""
    from toolgraph.inference import load as _load

    return _load(path)
