import pytest
import torch

from toolgraph import metrics as M
from toolgraph.config import EvalConfig
from toolgraph.data import load_dataset
from toolgraph.data.request_pieces import sentences
from toolgraph.data.schema import Agent, Tool
from toolgraph.errors import ConfigError
from toolgraph.evaluation import evaluate
from toolgraph.retrieval import RETRIEVERS, Retriever
from toolgraph.retrieval.agents import NONE
from toolgraph.retrieval.steps import merge_steps, ranks


def make(name, tiny_bert_dir, **kw):
    cls = RETRIEVERS.get(name)
    dense = {"name": "dense", "model": str(tiny_bert_dir), "cache_dir": None, "progress": False, "max_length": 64}
    return cls(cls.Config(name=name, dense=dense, **kw))


@pytest.fixture
def mcp(mcp_catalog):
    s, t = mcp_catalog
    return load_dataset("mcp", s.parent, servers=str(s), tasks=str(t))


def fitted(name, ds, tiny_bert_dir, **kw):
    r = make(name, tiny_bert_dir, **kw)
    r.fit(ds)
    r.index(ds.tools)
    return r


QUERIES = ["seven day weather forecast for Paris", "book a seat on a flight to Rome", "price of a stock ticker"]


def test_t2a_ranks_agents_by_their_best_entity(mcp, tiny_bert_dir):
    r = fitted("t2a", mcp, tiny_bert_dir, scorer="dense")
    ent = r.entity_scores(QUERIES, r._mask(True, True))  # [Q, N + A]
    n = len(r.tools)
    for a_i, agent in enumerate(r.agents):
        own = [i for i, t in enumerate(r.tools) if t.agent == agent.id] + [n + a_i]
        assert torch.allclose(r.agent_scores(QUERIES)[:, a_i], ent[:, own].max(1).values)


def test_tool_only_is_the_roll_up_of_the_tool_ranking(mcp, tiny_bert_dir):
    r = fitted("tool_only", mcp, tiny_bert_dir, scorer="rrf")
    tools = r.retrieve(QUERIES, len(r.tools)).ids
    agents = r.retrieve_agents(QUERIES, len(r.agents)).ids
    assert agents == [M.roll_up(t, mcp.agent_of()) for t in tools]


def test_agent_only_ignores_tool_texts(mcp, tiny_bert_dir):
    r = fitted("agent_only", mcp, tiny_bert_dir, scorer="dense")
    before = r.agent_scores(QUERIES)
    r.index([Tool(t.id, t.name, "something else entirely", t.agent) for t in mcp.tools])
    assert torch.allclose(before, r.agent_scores(QUERIES))


def test_rrf_by_hand(mcp, tiny_bert_dir):
    r = fitted("t2a", mcp, tiny_bert_dir, scorer="rrf", rrf_k=10, bm25_weight=2.0)
    d, b = r._dense_scores(QUERIES[:1])[0], r._bm25_scores(QUERIES[:1])[0]

    def rank(s):
        order = sorted(range(len(s)), key=lambda i: (-float(s[i]), i))
        return {e: pos + 1 for pos, e in enumerate(order)}

    rd, rb = rank(d), rank(b)
    want = torch.tensor([1 / (10 + rd[e]) + 2 / (10 + rb[e]) for e in range(len(d))])
    assert torch.allclose(r.entity_scores(QUERIES[:1], r._mask(True, True))[0], want)
    w = fitted("t2a", mcp, tiny_bert_dir, scorer="weighted_rrf", rrf_k=10, bm25_weight=2.0, agent_weight=3.0)
    n = len(r.tools)
    got = w.entity_scores(QUERIES[:1], w._mask(True, True))[0]
    assert torch.allclose(got[:n], want[:n]) and torch.allclose(got[n:], 3 * want[n:])


def test_score_fusion_by_hand_normalises_over_the_entities_ranked(mcp, tiny_bert_dir):
    from toolgraph.data.schema import Tool as T
    from toolgraph.retrieval.fusion_model import normalise

    r = fitted("t2a", mcp, tiny_bert_dir, scorer="score", bm25_weight=0.3)
    d, b = r._dense_scores(QUERIES), r._bm25_scores(QUERIES)
    n = len(r.tools)
    tools_only = r.entity_scores(QUERIES, r._mask(True, False))
    want = normalise(d[:, :n], "minmax") + 0.3 * normalise(b[:, :n], "minmax")  # the fusion retriever's rule
    assert torch.allclose(tools_only[:, :n], want, atol=1e-6) and (tools_only[:, n:] == NONE).all()
    both = r.entity_scores(QUERIES, r._mask(True, True))
    assert torch.allclose(both, normalise(d, "minmax") + 0.3 * normalise(b, "minmax"), atol=1e-6)
    # the default fusion retriever over the same two members ranks the tools the same way
    fusion = RETRIEVERS.get("fusion")
    f = fusion(fusion.Config(name="fusion", method="score", weights=[1.0, 0.3], members=[
        {"name": "dense", "model": str(tiny_bert_dir), "cache_dir": None, "progress": False, "max_length": 64},
        {"name": "bm25"}]))
    plain = [T(t.id, t.name, t.description, None, t.category, t.parameters) for t in mcp.tools]  # no owners
    f.fit(mcp)
    f.index(plain)
    alone = fitted("tool_only", mcp, tiny_bert_dir, scorer="score", bm25_weight=0.3)
    alone.index(plain, [])
    assert f.retrieve(QUERIES, 5).ids == alone.retrieve(QUERIES, 5).ids



def test_the_default_is_score_fusion_at_the_val_chosen_weight_and_rrf_keeps_equal_votes(mcp, tiny_bert_dir):
    """A t2a config that names neither scorer nor weight fuses min-max scores with BM25 at 0.3; rrf
    without a weight keeps 1.0 (the rule measured before); a weight given is used by either."""
    from toolgraph.retrieval.agents import AgentRetrieverConfig

    assert (AgentRetrieverConfig().scorer, AgentRetrieverConfig().bm25_share()) == ("score", 0.3)
    assert AgentRetrieverConfig(scorer="rrf").bm25_share() == 1.0
    assert AgentRetrieverConfig(scorer="rrf", bm25_weight=0.5).bm25_share() == 0.5
    assert AgentRetrieverConfig(bm25_weight=0.0).bm25_share() == 0.0
    default = fitted("t2a", mcp, tiny_bert_dir)
    explicit = fitted("t2a", mcp, tiny_bert_dir, scorer="score", bm25_weight=0.3)
    rrf = fitted("t2a", mcp, tiny_bert_dir, scorer="rrf")
    equal = fitted("t2a", mcp, tiny_bert_dir, scorer="rrf", bm25_weight=1.0)
    mask = default._mask(True, True)
    assert torch.equal(default.entity_scores(QUERIES, mask), explicit.entity_scores(QUERIES, mask))
    assert torch.equal(rrf.entity_scores(QUERIES, mask), equal.entity_scores(QUERIES, mask))
    assert not torch.allclose(default.entity_scores(QUERIES, mask), rrf.entity_scores(QUERIES, mask))

def test_bm25_t2a_finds_the_owner(mcp, tiny_bert_dir):
    r = fitted("t2a", mcp, tiny_bert_dir, scorer="bm25")
    top = r.retrieve_agents(QUERIES, 2).ids
    assert [t[0] for t in top] == ["weather-server", "flights", "finance"]
    tools = r.retrieve(QUERIES, 3).ids
    assert tools[0][0] == "weather-server::get_forecast" and tools[1][0] == "flights::book_flight"


def test_tool_level_output_puts_the_chosen_agents_tools_first(mcp, tiny_bert_dir):
    r = fitted("t2a", mcp, tiny_bert_dir, scorer="dense", route_agents=2)
    agents = r.retrieve_agents(QUERIES, 2).ids
    owner = mcp.agent_of()
    for q, ranking in enumerate(r.retrieve(QUERIES, len(r.tools)).ids):
        n_inside = sum(owner[t] in agents[q] for t in ranking)
        assert all(owner[t] in agents[q] for t in ranking[:n_inside])


@pytest.mark.parametrize("name", ["t2a", "agent_only", "tool_only", "mcp_zero"])
def test_one_scoring_per_call_and_agents_with_tools_agree(mcp, tiny_bert_dir, name):
    r = fitted(name, mcp, tiny_bert_dir, scorer="dense" if name == "mcp_zero" else "rrf")
    calls = []
    encode = r.dense.encode_queries
    r.dense.encode_queries = lambda qs: calls.append(len(qs)) or encode(qs)
    tools = r.retrieve(QUERIES, len(r.tools))
    agents = r.retrieve_agents(QUERIES, 2)
    both = r.retrieve_agents_and_tools(QUERIES, 2)
    assert calls == [len(QUERIES)] * 3  # each call encodes the queries once, however many rankings it derives
    assert both[0].ids == agents.ids and torch.allclose(both[0].scores, agents.scores)
    assert both[1].ids == tools.ids and torch.allclose(both[1].scores, tools.scores)


def test_plain_retrievers_roll_up_agents_with_tools(mcp):
    r = RETRIEVERS.get("bm25")(RETRIEVERS.get("bm25").Config(name="bm25"))
    r.index(mcp.tools)
    agents, tools = r.retrieve_agents_and_tools(QUERIES, 2)
    assert agents.ids == r.retrieve_agents(QUERIES, 2).ids == [M.roll_up(t, mcp.agent_of())[:2] for t in tools.ids]
    assert tools.ids == r.retrieve(QUERIES, len(r.tools)).ids
    best = {}
    for t, v in zip(tools.ids[0], tools.scores[0].tolist()):
        best.setdefault(mcp.agent_of()[t], v)
    assert agents.scores[0].tolist() == pytest.approx([best[a] for a in agents.ids[0]])


def test_mcp_zero_formula_by_hand(mcp, tiny_bert_dir):
    r = fitted("mcp_zero", mcp, tiny_bert_dir, scorer="dense", servers=2)
    s = r._dense_scores(QUERIES[:1])[0].clamp(min=0)
    n = len(r.tools)
    server = s[n:]
    kept = sorted(range(len(r.agents)), key=lambda a: (-float(server[a]), a))[:2]
    best = {}
    for i, t in enumerate(r.tools):
        a = r.agents.index(next(x for x in r.agents if x.id == t.agent))
        if a in kept:
            v = float(server[a] * s[i] * max(server[a], s[i]))
            best[a] = max(best.get(a, -1.0), v)
    want = sorted(kept, key=lambda a: (-best[a], a)) + sorted(set(range(len(r.agents))) - set(kept),
                                                                key=lambda a: (-float(server[a]), a))
    got = r.retrieve_agents(QUERIES[:1], len(r.agents)).ids[0]
    assert got == [r.agents[a].id for a in want]


def test_step_merges_by_hand():
    s = torch.tensor([[0.9, 0.8, 0.1, 0.0], [0.0, 0.7, 0.1, 0.95]])  # step 1 wants item 0, step 2 item 3
    assert ranks(s).tolist() == [[1, 2, 3, 4], [4, 2, 3, 1]]
    inter = merge_steps(s, "interleave")
    assert inter.argsort(descending=True).tolist()[:2] == [0, 3]  # each step's best first
    assert merge_steps(s, "rrf").argmax() == 1  # consensus: second in both steps wins
    assert torch.equal(merge_steps(s, "max"), torch.tensor([0.9, 0.8, 0.1, 0.95]))
    assert torch.equal(merge_steps(s[:1], "rrf"), s[0])
    with pytest.raises(ValueError, match="step merge"):
        merge_steps(s, "mean")
    assert sentences("Plan a trip. Find a flight! Any hotels? ok") == ["Plan a trip.", "Find a flight!",
                                                                      "Any hotels?", "ok"]


def test_single_step_equals_direct(mcp, tiny_bert_dir):
    r = fitted("t2a", mcp, tiny_bert_dir)
    assert r.retrieve_agents(QUERIES, 3).ids == r.retrieve_agents(QUERIES, 3, steps=[[q] for q in QUERIES]).ids
    assert r.retrieve(QUERIES, 4).ids == r.retrieve_steps([[q] for q in QUERIES], 4).ids


def test_evaluate_uses_the_agent_ranking_and_annotated_steps(mcp, tiny_bert_dir):
    r = fitted("t2a", mcp, tiny_bert_dir, scorer="bm25")
    rep = evaluate(r, mcp, "test", EvalConfig(ks=[1, 3], query_mode="step-wise", steps="annotated"))
    assert rep.notes["steps"]["annotated"] == 3 and rep.notes["steps"]["steps_per_query"] == 2.0
    qs = mcp.split("test")
    agents = r.retrieve_agents([q.text for q in qs], 100, steps=[list(q.steps) for q in qs]).ids
    gold = [sorted({mcp.agent_of()[t] for t in q.tools}) for q in qs]
    assert rep.agent_metrics == M.compute(agents, gold, [1, 3], EvalConfig().metrics)
    with pytest.raises(ConfigError, match="query_mode"):
        evaluate(r, mcp, "test", EvalConfig(query_mode="stepwise"))


def test_save_load_encodes_nothing_and_ranks_the_same(mcp, tiny_bert_dir, tmp_path):
    r = fitted("t2a", mcp, tiny_bert_dir, scorer="rrf")
    assert r.encoded == len(mcp.tools) + len(mcp.agents)
    r.save(tmp_path / "idx")
    back = Retriever.load(tmp_path / "idx")
    assert type(back) is type(r) and back.agents == r.agents
    assert back.retrieve_agents(QUERIES, 3).ids == r.retrieve_agents(QUERIES, 3).ids
    assert back.retrieve(QUERIES, 5).ids == r.retrieve(QUERIES, 5).ids
    assert back.encoded == 0


def test_sync_encodes_only_changed_entries(mcp, tiny_bert_dir):
    r = fitted("t2a", mcp, tiny_bert_dir)
    tools = {t.id: t for t in mcp.tools}
    tools["flights::book_flight"] = Tool("flights::book_flight", "book_flight", "reserve seats", "flights")
    tools["finance::stock_quote"] = Tool("finance::stock_quote", "stock_quote", "quote", "finance", parameters={"x": 1})
    del tools["hotels::reserve_room"]
    tools["news::headlines"] = Tool("news::headlines", "headlines", "top news stories", "news")
    agents = list(mcp.agents) + [Agent("news", "news", "News of the day")]
    counts = r.sync(tools.values(), agents)
    assert counts == {"added": 2, "removed": 1, "updated": 2, "unchanged": len(mcp.tools) + len(mcp.agents) - 3,
                      "encoded": 4, "tools": len(mcp.tools), "agents": len(mcp.agents) + 1}
    # 4 texts: 2 changed tools, the new tool and the new agent; the parameter change hashes differently and its text ('default' shows parameter names) changed too
    assert tools["finance::stock_quote"] != mcp.tool_by_id()["finance::stock_quote"]
    fresh = fitted("t2a", mcp, tiny_bert_dir)
    fresh.index(tools.values(), agents)
    assert torch.allclose(fresh.tool_vectors, r.tool_vectors, atol=1e-6)
    assert r.sync(tools.values(), agents)["encoded"] == 0


def test_index_without_agents_makes_bare_owners(tiny_bert_dir):
    r = make("t2a", tiny_bert_dir)
    r.index([Tool("a::x", "x", "do x", "a"), Tool("b::y", "y", "do y", "b"), Tool("z", "z", "no owner")])
    assert [a.id for a in r.agents] == ["a", "b"]
    assert r.retrieve_agents(["do x"], 5).ids[0] == ["a", "b"] or r.retrieve_agents(["do x"], 5).ids[0] == ["b", "a"]
    assert r.agent_scores(["q"]).shape == (1, 2) and (r.agent_scores(["q"]) > NONE).all()


@pytest.mark.parametrize("name,kw,match", [
    ("t2a", {"scorer": "cosine"}, "retriever.scorer"),
    ("t2a", {"agent_text": "all"}, "retriever.agent_text"),
    ("mcp_zero", {"scorer": "rrf"}, "mcp_zero scores with cosine"),
    ("t2a", {"route_agents": 0}, "route_agents"),
])
def test_config_errors(tiny_bert_dir, name, kw, match):
    with pytest.raises(ConfigError, match=match):
        make(name, tiny_bert_dir, **kw)


def test_dense_member_must_be_a_bi_encoder(mcp):
    cls = RETRIEVERS.get("t2a")
    r = cls(cls.Config(dense={"name": "bm25"}))
    with pytest.raises(ConfigError, match="retriever.dense: needs a dense retriever"):
        r.index(mcp.tools)


def test_load_builds_and_indexes_from_a_config(mcp_catalog, tiny_bert_dir, tmp_path):
    import toolgraph
    from toolgraph.cli import main as cli

    root = mcp_catalog[0].parent.parent
    cfg = {"data": {"name": "mcp", "root": str(root), "split": "test",
                    "options": {"servers": "mcp/servers.json", "tasks": "mcp/tasks.json"}},
           "retriever": {"name": "t2a", "scorer": "bm25",
                         "dense": {"name": "dense", "model": str(tiny_bert_dir), "cache_dir": None,
                                   "progress": False}}}
    r = toolgraph.load(cfg)
    assert len(r.tools) == 10 and r.retrieve_agents(["seven day weather forecast"], 1).ids == [["weather-server"]]
    # the shipped MCP config runs as is once the files sit under the data root
    out = tmp_path / "eval"
    rc = cli(["evaluate", "--config", "configs/eval/t2a_mcp.yaml", f"data.root={root}", "retriever.scorer=bm25",
              f"retriever.dense.model={tiny_bert_dir}", "retriever.dense.cache_dir=null", "--out", str(out)])
    assert rc == 0
    import json

    res = json.loads((out / "results.json").read_text())
    assert res["notes"]["steps"]["annotated"] == 3 and res["agent_metrics"]["recall@5"] > 0
    back = toolgraph.load(out / "retriever")
    assert back.retrieve_agents(["book a flight"], 2).ids == r.retrieve_agents(["book a flight"], 2).ids
