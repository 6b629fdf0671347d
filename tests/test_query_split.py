"""retriever.query_split: a request split into pieces, each scored, a tool's score its best piece's."""

import pytest
import torch

from toolgraph.config import load_config
from toolgraph.errors import ConfigError
from toolgraph.retrieval import RETRIEVERS
from toolgraph.retrieval.dense import DenseConfig, DenseRetriever
from toolgraph.retrieval.steps import clauses, merge_piece_hits, split_scores

TWO_THINGS = "Create a new device named iEdge in the network. After that, verify my session token is still valid"


def test_clauses_split_at_sentence_ends_and_connectives_and_drop_short_pieces():
    assert clauses(TWO_THINGS) == ["Create a new device named iEdge in the network",
                                   "After that, verify my session token is still valid"]
    assert clauses("Get the weather in Paris, and then book a hotel there; also convert 10 dollars to euro.") == [
        "Get the weather in Paris", "book a hotel there", "convert 10 dollars to euro"]
    assert clauses("Can you also find a website for workout music?") == [
        "Can you also find a website for workout music?"]  # "Can you" (2 words) dropped: one piece left
    assert clauses("Thanks. Find a list of Portuguese books.") == ["Thanks. Find a list of Portuguese books."]
    assert clauses("Additionally, convert 10 dollars to euro") == ["Additionally, convert 10 dollars to euro"]


def test_split_scores_take_each_tools_best_piece():
    vectors = {"a b c.": [1.0, 0.0], "d e f": [0.0, 1.0], "a b c. d e f": [0.5, 0.5], "g h": [0.2, 0.1]}
    calls = []

    def score(texts):
        calls.append(list(texts))
        return torch.tensor([vectors[t] for t in texts])

    assert torch.equal(split_scores(score, ["a b c. d e f", "g h"], "none"), torch.tensor([[0.5, 0.5], [0.2, 0.1]]))
    out = split_scores(score, ["a b c. d e f", "g h"], "sentences")
    assert torch.equal(out, torch.tensor([[1.0, 1.0], [0.2, 0.1]]))
    assert calls[-1] == ["a b c.", "d e f", "g h"]  # one call scores every piece of every request
    with pytest.raises(ValueError, match="query split must be one of"):
        split_scores(score, ["g h"], "words")


def test_pieces_hits_from_an_index_merge_by_best_score_then_position():
    values = torch.tensor([[0.9, 0.5, 0.1], [0.7, 0.5, 0.4], [0.8, 0.3, 0.2]])
    indices = torch.tensor([[3, 1, 0], [1, 2, 3], [0, 2, 4]])
    v, i = merge_piece_hits(values, indices, [2, 1], 3)  # query 0: pieces 0 and 1; query 1: piece 2
    assert i.tolist() == [[3, 1, 2], [0, 2, 4]]
    assert torch.allclose(v, torch.tensor([[0.9, 0.7, 0.5], [0.8, 0.3, 0.2]]))


def dense(tiny_bert_dir, split="none"):
    r = DenseRetriever(DenseConfig(model=str(tiny_bert_dir), cache_dir=None, progress=False, query_split=split))
    from toolgraph.data.schema import Tool

    r.index([Tool("t1", "create_device", "create a device in a network"),
             Tool("t2", "check_token", "check whether a session token is valid"),
             Tool("t3", "get_weather", "current weather for a city")])
    return r


def test_a_dense_retriever_scores_a_split_request_by_its_best_piece(tiny_bert_dir):
    whole, split = dense(tiny_bert_dir), dense(tiny_bert_dir, "clauses")
    pieces = clauses(TWO_THINGS)
    assert len(pieces) == 2
    expected = whole.score(pieces).max(0).values
    got = split.score([TWO_THINGS, "weather in Paris today"])
    assert torch.allclose(got[0], expected, atol=1e-6)
    assert torch.allclose(got[1], whole.score(["weather in Paris today"])[0], atol=1e-6)  # one piece: as before
    ranking = split.retrieve([TWO_THINGS], 3)
    assert ranking.ids[0] == [split.tools[i].id for i in expected.argsort(descending=True, stable=True).tolist()]


def test_the_split_is_saved_with_the_retriever(tiny_bert_dir, tmp_path):
    from toolgraph.retrieval import Retriever

    r = dense(tiny_bert_dir, "clauses")
    r.save(tmp_path / "index")
    back = Retriever.load(tmp_path / "index")
    assert back.config.query_split == "clauses"
    assert torch.allclose(back.score([TWO_THINGS]), r.score([TWO_THINGS]), atol=1e-6)


def test_t2a_splits_requests_as_its_dense_member_says(mcp_catalog, tiny_bert_dir):
    from toolgraph.data import load_dataset

    s, t = mcp_catalog
    ds = load_dataset("mcp", s.parent, servers=str(s), tasks=str(t))
    cls = RETRIEVERS.get("t2a")
    member = {"name": "dense", "model": str(tiny_bert_dir), "cache_dir": None, "progress": False}
    plain = cls(cls.Config(dense=member, scorer="dense"))
    split = cls(cls.Config(dense={**member, "query_split": "clauses"}, scorer="dense"))
    for r in (plain, split):
        r.fit(ds)
        r.index(ds.tools)
    request = "Get the seven day weather forecast for Paris, and then book a seat on a flight to Rome"
    pieces = clauses(request)
    assert len(pieces) == 2
    assert torch.allclose(split.raw_scores([request])["dense"][0], plain.raw_scores(pieces)["dense"].max(0).values,
                          atol=1e-6)


def test_an_unknown_split_names_the_key(tmp_path):
    from toolgraph.config import EvaluateConfig

    cfg = tmp_path / "eval.yaml"
    cfg.write_text("retriever: {name: dense, query_split: words}\n")
    with pytest.raises(ConfigError, match="query_split"):
        load_config(EvaluateConfig, [cfg])


def test_a_key_can_be_added_to_a_presets_inline_dense_retriever_and_a_wrong_one_is_named(tmp_path):
    from pathlib import Path

    from toolgraph.config import EvaluateConfig
    from toolgraph.retrieval.loading import resolve_retriever

    preset = Path(__file__).resolve().parents[1] / "configs" / "eval" / "t2a_draft_g2.yaml"
    cfg = load_config(EvaluateConfig, [preset], ["retriever.dense.query_split=clauses"])
    assert cfg.retriever.dense["query_split"] == "clauses"
    assert cfg.retriever.dense["encoder"]["name"] == "toolgraph-general"  # the preset's keys kept
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(f"defaults: [{preset}]\nretriever:\n  dense: {{query_splt: clauses}}\n")
    wrong = load_config(EvaluateConfig, [overlay])
    with pytest.raises(ConfigError, match="query_splt"):
        _ = resolve_retriever(wrong.retriever).dense  # the inline member is built (and checked) on first use


def test_the_serving_default_splits_requests_into_clauses():
    from pathlib import Path

    from toolgraph.config import EvaluateConfig
    from toolgraph.retrieval.agents import DEFAULT_DENSE
    assert DenseRetriever.parse_config(dict(DEFAULT_DENSE)).query_split == "clauses"
    preset = Path(__file__).resolve().parents[1] / "configs" / "retriever" / "t2a.yaml"
    assert load_config(EvaluateConfig, [preset]).retriever.dense["query_split"] == "clauses"


def test_split_names_are_the_config_values():
    """config.QuerySplit (what a config may say) and steps.SPLITS (what a retriever can do) name the same rules."""
    from typing import get_args

    from toolgraph.config import QuerySplit
    from toolgraph.retrieval.steps import SPLITS, pieces

    assert tuple(SPLITS) == get_args(QuerySplit)
    assert pieces(["Find a hotel. Then book a taxi to it"], "none") == [["Find a hotel. Then book a taxi to it"]]
    with pytest.raises(ValueError, match="words"):
        pieces(["x"], "words")
