"""retriever.query_split: a request split into pieces, each scored, a tool's score its best piece's."""

import pytest
import torch

from toolgraph.config import load_config
from toolgraph.data.request_pieces import clauses
from toolgraph.errors import ConfigError
from toolgraph.retrieval import RETRIEVERS
from toolgraph.retrieval.dense import DenseConfig, DenseRetriever
from toolgraph.retrieval.steps import COVER_STEP, blend_piece_hits, blend_rows, split_scores

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


def test_split_scores_blend_the_whole_request_with_the_best_piece():
    vectors = {"a b c.": [1.0, 0.0], "d e f": [0.0, 1.0], "a b c. d e f": [0.5, 0.2], "g h": [0.2, 0.1]}
    calls = []

    def score(texts):
        calls.append(list(texts))
        return torch.tensor([vectors[t] for t in texts])

    out = split_scores(score, ["a b c. d e f", "g h"], "sentences", whole=0.25)
    assert torch.allclose(out, torch.tensor([[0.25 * 0.5 + 0.75, 0.25 * 0.2 + 0.75], [0.2, 0.1]]))
    assert calls[-1] == ["a b c. d e f", "a b c.", "d e f", "g h"]  # the whole request only where it was split
    assert torch.equal(split_scores(score, ["a b c. d e f"], "sentences", whole=1.0), torch.tensor([[0.5, 0.2]]))


def test_cover_puts_each_pieces_best_tool_first_and_leaves_the_rest():
    pieces = torch.tensor([[0.9, 0.85, 0.8, 0.1, 0.0],    # piece A: three good tools
                           [0.2, 0.1, 0.0, 0.5, 0.45]])  # piece B: its best (tool 3) below A's runners-up
    plain = blend_rows(pieces)
    assert plain.topk(2).indices.tolist() == [0, 1]  # without cover B's tool has no place in the top 2
    covered = blend_rows(pieces, cover=True)
    assert covered.topk(2).indices.tolist() == [0, 3]  # each piece's best first, in its piece's order
    assert torch.allclose(covered[[0, 3]], torch.tensor([0.9 + COVER_STEP * 1.9, 0.9 + COVER_STEP * 1.5]))
    rest = torch.tensor([1, 2, 4])
    assert torch.equal(covered[rest], plain[rest])  # the others keep their scores
    same = blend_rows(torch.tensor([[0.9, 0.1], [0.7, 0.2]]), cover=True)  # both pieces' best is tool 0
    assert same.argmax() == 0 and same[1] == 0.2
    with_whole = torch.cat([torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.9]]), pieces])  # row 0: the whole request
    out = blend_rows(with_whole, 0.5, cover=True)
    assert out.topk(2).indices.tolist() == [0, 3]  # the whole request's own best (tool 4) is not lifted
    assert torch.allclose(out[4], torch.tensor(0.5 * 0.9 + 0.5 * 0.45))
    assert torch.equal(blend_rows(pieces[:1], cover=True), pieces[0])  # one piece: as before


def test_cover_reaches_the_retriever_and_its_faiss_index_agrees(tiny_bert_dir):
    from dataclasses import replace

    plain, covered = dense(tiny_bert_dir, "clauses"), dense(tiny_bert_dir, "clauses")
    covered.config = replace(covered.config, query_split_whole=0.3, query_split_cover=True)
    plain.config = replace(plain.config, query_split_whole=0.3)
    whole = dense(tiny_bert_dir)
    rows = whole.score([TWO_THINGS, *clauses(TWO_THINGS)])  # [whole request, piece, piece]
    assert torch.allclose(covered.score([TWO_THINGS])[0], blend_rows(rows, 0.3, cover=True), atol=1e-6)
    assert torch.allclose(plain.score([TWO_THINGS])[0], blend_rows(rows, 0.3), atol=1e-6)
    exact = covered.retrieve([TWO_THINGS, "weather in Paris today"], 3)
    covered.config = replace(covered.config, index="faiss")
    covered.index(list(covered.tools))
    ann = covered.retrieve([TWO_THINGS, "weather in Paris today"], 3)
    assert ann.ids == exact.ids
    assert torch.allclose(torch.as_tensor(ann.scores), torch.as_tensor(exact.scores), atol=1e-5)


def test_index_hits_of_every_text_are_scored_exactly_and_blended_ties_by_position():
    tools = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.6], [0.9, 0.1], [0.1, 0.2]])  # [N, H]
    texts = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])  # query 0: pieces 0 and 1; query 1: text 2
    hits = torch.tensor([[0, 3, 2], [1, 2, -1], [2, 0, 1]])  # [T, k]; -1: no hit
    v, i = blend_piece_hits(texts, hits, [2, 1], tools, 0.0, 3)
    assert i.tolist() == [[0, 1, 3], [2, 0, 1]]  # 0 and 1 tie at 1.0: the lower position first
    assert torch.allclose(v, torch.tensor([[1.0, 1.0, 0.9], [0.6, 0.5, 0.5]]))
    v, i = blend_piece_hits(texts, hits, [2, 1], tools, 0.5, 2)  # row 0 of a query is then its whole request
    assert i.tolist() == [[2, 0], [2, 0]]  # query 0, tool 2: 0.5 * 0.6 + 0.5 * 0.6; tools 0, 1, 3 tie at 0.5
    assert torch.allclose(v, torch.tensor([[0.6, 0.5], [0.6, 0.5]]))


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


def test_the_serving_default_splits_into_clauses_keeps_the_whole_request_at_0_3_and_covers_each_clause():
    from pathlib import Path

    from toolgraph.config import EvaluateConfig
    from toolgraph.retrieval.agents import DEFAULT_DENSE
    default = DenseRetriever.parse_config(dict(DEFAULT_DENSE))
    assert (default.query_split, default.query_split_whole, default.query_split_cover) == ("clauses", 0.3, True)
    preset = Path(__file__).resolve().parents[1] / "configs" / "retriever" / "t2a.yaml"
    dense = load_config(EvaluateConfig, [preset]).retriever.dense
    assert (dense["query_split"], dense["query_split_whole"], dense["query_split_cover"]) == ("clauses", 0.3, True)


def test_split_names_are_the_config_values():
    """config.QuerySplit (what a config may say) and steps.SPLITS (what a retriever can do) name the same rules."""
    from typing import get_args

    from toolgraph.config import QuerySplit
    from toolgraph.retrieval.steps import SPLITS, pieces

    assert tuple(SPLITS) == get_args(QuerySplit)
    assert pieces(["Find a hotel. Then book a taxi to it"], "none") == [["Find a hotel. Then book a taxi to it"]]
    with pytest.raises(ValueError, match="words"):
        pieces(["x"], "words")


def test_whole_weight_blends_in_the_retriever_and_its_faiss_index_agrees(tiny_bert_dir):
    from dataclasses import replace

    whole, split = dense(tiny_bert_dir), dense(tiny_bert_dir, "clauses")
    split.config = replace(split.config, query_split_whole=0.4)
    request = TWO_THINGS
    expected = 0.4 * whole.score([request])[0] + 0.6 * whole.score(clauses(request)).max(0).values
    assert torch.allclose(split.score([request])[0], expected, atol=1e-6)
    exact = split.retrieve([request, "weather in Paris today"], 3)
    split.config = replace(split.config, index="faiss")
    split.index(list(split.tools))
    assert split._ann is not None
    ann = split.retrieve([request, "weather in Paris today"], 3)
    assert ann.ids == exact.ids
    assert torch.allclose(torch.as_tensor(ann.scores), torch.as_tensor(exact.scores), atol=1e-5)


def test_a_whole_weight_outside_0_1_is_refused_by_name(tmp_path):
    from toolgraph.config import EvaluateConfig

    cfg = tmp_path / "eval.yaml"
    cfg.write_text("retriever: {name: dense, query_split: clauses, query_split_whole: 1.5}\n")
    with pytest.raises(ConfigError, match="query_split_whole"):
        load_config(EvaluateConfig, [cfg])


def test_a_cover_that_is_not_a_boolean_is_refused_by_name(tmp_path):
    from toolgraph.config import EvaluateConfig

    cfg = tmp_path / "eval.yaml"
    cfg.write_text("retriever: {name: dense, query_split: clauses, query_split_cover: maybe}\n")
    with pytest.raises(ConfigError, match="query_split_cover"):
        load_config(EvaluateConfig, [cfg])
    cfg.write_text("retriever: {name: dense, query_split: clauses, query_split_cover: true}\n")
    assert load_config(EvaluateConfig, [cfg]).retriever.query_split_cover is True
