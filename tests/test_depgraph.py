"""Dependency-graph construction: candidate pairs, predict-based scoring, edges and statistics."""

import json

import pytest
import torch

from toolgraph.data import load_dataset
from toolgraph.data.formats import read_edges
from toolgraph.data.schema import Tool
from toolgraph.data.tdi import document_tool
from toolgraph.depgraph import GraphConfig, build_graph, candidate_pairs, score_pairs, write_graph
from toolgraph.errors import ConfigError, DataError
from toolgraph.retrieval.loading import load_task


def _tools(n, **kw):
    return [Tool(id=str(i), name=f"t{i}", description="d", **kw) for i in range(n)]


def test_candidates_nearest_groups_and_proposals():
    vectors = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]]), dim=-1)
    tools = [Tool(id="0", name="a", description="", category="x"), Tool(id="1", name="b", description=""),
             Tool(id="2", name="c", description="", category="x"), Tool(id="3", name="d", description="")]
    assert candidate_pairs(tools, vectors, GraphConfig(top_m=1, same_category=False)) == [(0, 1), (2, 3)]
    assert candidate_pairs(tools, vectors, GraphConfig(top_m=1)) == [(0, 1), (0, 2), (2, 3)]
    assert candidate_pairs(tools, vectors, GraphConfig(top_m=1, max_group=1)) == [(0, 1), (2, 3)]
    proposed = [[3, 0], [], [], [1]]  # self-proposals are ignored, pairs are unordered
    assert candidate_pairs(tools, None, GraphConfig(same_category=False), proposed) == [(0, 3), (1, 3)]


def test_scores_match_a_plain_forward_pass(tiny_discriminator_ckpt):
    task = load_task(tiny_discriminator_ckpt)
    docs = {"a": "login_bank: sign in. returns: bank_token", "b": "use_bank: act. parameters: bank_token",
            "c": "misc_tool_1: helper"}
    pairs = [("a", "b"), ("b", "c"), ("c", "a")]
    tools = {i: document_tool(i, d) for i, d in docs.items()}  # name_desc renders the document back
    probs, rank = score_pairs(task, tools, pairs, "name_desc", GraphConfig(batch_size=2, accelerator="cpu"))
    assert rank == 0 and probs.shape == (3, 3)
    assert torch.allclose(probs.sum(1), torch.ones(3))
    for (x, y), p in zip(pairs, probs, strict=True):
        tok = task.tokenizer([docs[x]], [docs[y]], truncation="longest_first", max_length=48, return_tensors="pt")
        with torch.no_grad():
            ref = task.network(**{k: v for k, v in tok.items() if k != "token_type_ids"},
                               token_type_ids=tok.get("token_type_ids"))
            ref = (ref / task.temperature).softmax(-1)[0]  # calibrated on val when it was trained
        assert torch.allclose(p, ref, atol=1e-5)


def test_build_graph_statistics_and_edges_file(tiny_discriminator_ckpt, dependency_dataset_dir, tmp_path):
    ds = load_dataset(str(dependency_dataset_dir))
    task = load_task(tiny_discriminator_ckpt)
    cfg = GraphConfig(top_m=0, same_category=True, accelerator="cpu", keep_prob=0.0, threshold=0.0)
    edges, stats = build_graph(ds, task, cfg)
    n = len(ds.tools)
    # each service's two tools share a category: 16 candidate pairs, all gold, both directions kept
    assert stats["pairs_scored"] == 16 and stats["n_squared"] == n * n
    assert stats["gold_pairs_in_candidates"] == 1.0 and stats["gold_edges"] == 16
    assert stats["gold_edges_recovered"] == 1.0 and stats["edges_kept"] == 32 and stats["edge_precision"] == 0.5
    assert stats["discriminator_tool_text"] == "io"
    folder = write_graph(edges, stats, tmp_path / "g")
    assert json.loads((folder / "stats.json").read_text())["pairs_scored"] == 16
    assert len(read_edges(folder, threshold=0.0)) == 32
    probs = sorted(e["prob"] for e in edges)
    assert len(read_edges(folder / "edges.jsonl", threshold=probs[10])) == len([p for p in probs if p >= probs[10]])


def test_edge_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="neither 'gold' nor an edges.jsonl"):
        read_edges(tmp_path / "missing")
    bad = tmp_path / "edges.jsonl"
    bad.write_text('{"source": "a", "target": "b", "prob": 0.9}\n{"source": "a"}\n')
    with pytest.raises(DataError, match="edges.jsonl:2"):
        read_edges(bad)


def test_cli_graph_build(tiny_discriminator_ckpt, dependency_dataset_dir, tmp_path, capsys):
    from toolgraph.cli import main

    rc = main(["graph", "build", "--discriminator", str(tiny_discriminator_ckpt), "--data", str(dependency_dataset_dir),
               "--out", str(tmp_path / "g"), "top_m=2", "accelerator=cpu"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "pairs scored" in out and "of N^2" in out
    stats = json.loads((tmp_path / "g" / "stats.json").read_text())
    assert stats["config"]["top_m"] == 2 and stats["pairs_scored"] <= 40 * 2 + 16


def test_schema_blocking_pairs_what_one_tool_returns_with_what_another_takes(dependency_dataset_dir):
    from toolgraph.depgraph import schema_candidates

    tools = load_dataset(str(dependency_dataset_dir)).tools
    index = {t.id: i for i, t in enumerate(tools)}
    proposed = schema_candidates(tools, m=1)
    for w in ("bank", "mail", "garden"):  # do_w takes w_token, which login_w returns
        assert proposed[index[f"do_{w}"]][0] == index[f"login_{w}"]
        assert index[f"do_{w}"] in proposed[index[f"login_{w}"]]
    assert all(not p for t, p in zip(tools, proposed, strict=True) if t.id.startswith("misc"))
    # "token" is taken by 16 tools: with max_df below that, only the whole name "bank token" blocks
    narrow = schema_candidates(tools, m=5, max_df=2)
    assert sorted(narrow[index["do_bank"]]) == [index["login_bank"]]


def test_graph_file_describes_itself_and_carries_the_val_threshold(tiny_discriminator_ckpt, dependency_dataset_dir,
                                                                 tmp_path):
    from toolgraph.data.formats import read_graph_header

    ds = load_dataset(str(dependency_dataset_dir))
    task = load_task(tiny_discriminator_ckpt)
    edges, stats = build_graph(ds, task, GraphConfig(top_m=0, accelerator="cpu", keep_prob=0.0))
    assert stats["edge_threshold"] == pytest.approx(float(task.edge_threshold))  # None: the val choice
    folder = write_graph(edges, stats, tmp_path / "g", "runs/disc")
    header = read_graph_header(folder)
    assert header["dataset"] == ds.name and header["edges"] == len(edges)
    assert header["discriminator"]["checkpoint"] == "runs/disc" and header["edge_threshold"] == stats["edge_threshold"]
    kept = [e for e in edges if e["prob"] >= header["edge_threshold"]]
    assert len(read_edges(folder)) == len(kept)  # no threshold given: the header's


def test_cli_depgraph_build_with_schema_and_usage_blocking(tiny_discriminator_ckpt, dependency_dataset_dir, tmp_path,
                                                           capsys):
    from toolgraph.cli import main

    rc = main(["depgraph", "build", "--discriminator", str(tiny_discriminator_ckpt), "--data",
               str(dependency_dataset_dir), "--out", str(tmp_path / "g"), "schema_m=1", "top_m=0",
               "same_category=false", "usage_splits=[train]", "accelerator=cpu"])
    assert rc == 0 and "pairs scored" in capsys.readouterr().out
    stats = json.loads((tmp_path / "g" / "stats.json").read_text())
    assert stats["config"]["usage_splits"] == ["train"] and stats["config"]["schema_m"] == 1
    assert stats["gold_pairs_in_candidates"] == 1.0  # the login each service's tool needs: by schema
    assert json.loads((tmp_path / "g" / "edges.jsonl").read_text().splitlines()[0])["header"]["tools"] == 40




def test_schema_blocking_is_the_same_in_every_process():
    """Field words are sets, iterated in hash order, which changes per process (PYTHONHASHSEED): two
    suppliers tied for one consumer (one offers "alpha", the other "beta", it takes "alpha_beta")
    must come out in the same order every time."""
    import os
    import subprocess
    import sys

    code = ("import json; from toolgraph.data.schema import Tool; from toolgraph.depgraph import schema_candidates\n"
            "tools = [Tool('c', 'consume', '', parameters={'properties': {'alpha_beta': {}}})]\n"
            "tools += [Tool(f's{i}', f'make{i}', '', returns={w: {}}) for i, w in enumerate(['alpha', 'beta'] * 3)]\n"
            "print(json.dumps(schema_candidates(tools, 1)[0]))")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in range(8)}
    assert len(runs) == 1, runs


def _bag_of_words(texts):
    """A deterministic stand-in encoder: one dimension per word (crc32 bucket), L2-normalised."""
    import re
    import zlib

    out = torch.zeros(len(texts), 512)
    for i, t in enumerate(texts):
        for w in re.findall(r"[a-z]+", t.lower()):
            out[i, zlib.crc32(w.encode()) % 512] += 1.0
    return torch.nn.functional.normalize(out + 1e-6, dim=-1)


def test_io_candidates_pair_outputs_with_the_inputs_they_feed():
    from toolgraph.depgraph import io_candidates, io_texts

    login = Tool("login", "GetUserToken", "sign in", parameters={"username": {"description": "the user"}},
                 returns={"token": {"description": "session token"}})
    pay = Tool("pay", "Transfer", "send money", parameters={"token": {"description": "session token"},
                                                            "amount": {"description": "how much"}})
    weather = Tool("weather", "GetWeather", "forecast", parameters={"city": {"description": "a place"}},
                   returns={"forecast": {"description": "rain or sun"}})
    assert io_texts(login) == ("inputs: username: the user", "get user token. outputs: token: session token")
    assert io_texts(pay)[1] == "transfer. outputs: "
    tools = [login, pay, weather]
    cands = io_candidates(tools, _bag_of_words, m=1, doc_weight=0.0)
    assert cands[1][0] == 0  # Transfer's best producer: the tool that outputs a session token
    assert cands[0][1] == 1  # ... and GetUserToken's best consumer is Transfer
    assert all(i not in js for i, js in enumerate(cands)) and all(len(js) == 2 for js in cands)
    assert io_candidates(tools, _bag_of_words, m=0) == [[], [], []]
    assert io_candidates(tools[:1], _bag_of_words, m=3) == [[]]


@pytest.mark.parametrize("schema, fields", [
    ({"type": "object", "properties": {"a": {"description": "the A"}, "b": {}}}, [("a", "the A"), ("b", "")]),
    ({"required": [{"name": "x", "description": "X"}], "optional": [{"name": "y"}]}, [("x", "X"), ("y", "")]),
    ({"token": {"type": "str", "description": "tok"}}, [("token", "tok")]),
    ([{"name": "q", "description": "query"}, {"no": "name"}], [("q", "query")]),
    (None, []), ("not a schema", []),
])
def test_param_fields_reads_every_schema_shape(schema, fields):
    from toolgraph.data.schema import param_fields, param_names

    assert param_fields(schema) == fields and [n for n, _ in fields] == param_names(schema)
