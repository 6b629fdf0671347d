"""The scores the MCP tools serve: one scale for ``search_tools`` and ``search_agents`` (an agent
router's fused entity score; before, the tools of the routed agents carried a routing offset near
4.16 while agents scored ~0.03), a rank, tool names inside each agent, and a query's scores do not
depend on the requests it was batched with."""

import pytest
from test_serving import spec

from toolgraph.serving import LiveIndex
from toolgraph.sync import sync_index

RRF_TOP = 2 / 61  # 1 / (rrf_k + 1) for each of the two rankings (dense, BM25): first in both


@pytest.fixture(scope="module")
def t2a(tiny_bert_dir, tmp_path_factory):
    from conftest import write_mcp_catalog

    folder = tmp_path_factory.mktemp("t2a")
    catalog, _ = write_mcp_catalog(folder / "catalog")
    sync_index(catalog, folder / "idx", spec(tiny_bert_dir))
    live = LiveIndex(folder / "idx", check_every=0)
    yield live
    live.close()


QUERIES = ["seven day weather forecast", "book a flight to rome", "convert dollars to euros", "stock price"]


def test_tools_and_agents_are_scored_on_one_scale(t2a):
    for q in QUERIES:
        tools = t2a.search_tools(q, 5)
        agents = t2a.search_agents(q, 3)
        assert [t["rank"] for t in tools] == [1, 2, 3, 4, 5] and [a["rank"] for a in agents] == [1, 2, 3]
        assert all(0 < r["score"] <= RRF_TOP + 1e-6 for r in tools + agents), (tools, agents)  # no offset near 4
        inside = {t["id"]: t for a in agents for t in a["tools"]}
        for a in agents:  # an agent scores as its best entity: at least as high as each of its tools
            assert a["tools"] and all(t["score"] <= a["score"] + 1e-6 and t["name"] for t in a["tools"])
        for t in tools:  # the same tool scores the same in both answers
            if t["id"] in inside:
                assert inside[t["id"]]["score"] == t["score"] and inside[t["id"]]["name"] == t["name"]


def test_the_order_is_the_routers_and_the_scores_its_fused_entity_scores(t2a):
    r = t2a.retriever
    ranking = r.retrieve(QUERIES, 5)
    agents = r.retrieve_agents(QUERIES, 3)
    for i, q in enumerate(QUERIES):
        assert [t["id"] for t in t2a.search_tools(q, 5)] == ranking.ids[i]
        served = t2a.search_agents(q, 3)
        assert [a["id"] for a in served] == agents.ids[i]
        # t2a ranks agents by their best entity in the joint fusion: the served agent score is the router's
        assert [a["score"] for a in served] == [round(float(s), 6) for s in agents.scores[i]]
    assert ranking.scores.max() > 4  # the router's own tool ranking carries the routing offset; it is not served


def test_a_querys_scores_do_not_depend_on_its_batch(t2a):
    alone = [t2a._tools([q], 5)[0] for q in QUERIES]
    assert t2a._tools(QUERIES, 5) == alone  # the routing offset was the batch's max score + 1, times 4
    alone = [t2a._agents([q], 3)[0] for q in QUERIES]
    assert t2a._agents(QUERIES, 3) == alone


def test_the_startup_line_names_the_encoder_and_the_scorer(t2a, tiny_bert_dir):
    from toolgraph.retrieval.loading import resolve_retriever
    from toolgraph.serving import _encoder_said

    said = _encoder_said(t2a._state.retriever)
    assert said.startswith(", encoder ") and said.endswith(", scorer rrf")  # this index was built with rrf
    assert _encoder_said(resolve_retriever({"name": "bm25"}, "retriever")) == ""
