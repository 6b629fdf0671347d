"""Registry scale on small catalogs: the scale-catalog generator, FAISS indexes (round trip, in-place
add/remove, auto), resumable chunked encoding (kill -9, two ranks) and index sync over an ANN index.
The 1k -> 1M measurements are benchmarks/scale_bench.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from toolgraph.data.scale import scale_catalog
from toolgraph.data.schema import Tool
from toolgraph.retrieval.ann import AnnConfig, AnnIndex
from toolgraph.retrieval.base import Retriever
from toolgraph.retrieval.chunks import encode_in_chunks
from toolgraph.retrieval.dense import DenseConfig, DenseRetriever

WORDS = ["weather", "flights", "hotels", "money", "music", "news", "maps", "mail", "stocks", "recipes",
         "movies", "sports", "translate", "calendar", "photos", "files", "shopping", "health", "jobs", "cars"]


def _tools(n: int, start: int = 0) -> list[Tool]:
    return [Tool(f"t{i}", f"{WORDS[i % 20]} tool {i}", f"get {WORDS[i % 20]} and {WORDS[(i * 7) % 20]} item {i}",
                 agent=f"server{i % 13}") for i in range(start, start + n)]


def _dense(tiny_bert_dir, index="exact", **ann) -> DenseRetriever:
    return DenseRetriever(DenseConfig(encoder={"name": str(tiny_bert_dir), "cache_dir": None}, progress=False,
                                      index=index, ann=AnnConfig(**ann)))


def _exact_top(r: DenseRetriever, queries: list[str], k: int) -> list[list[str]]:
    top = (r.encode_queries(queries) @ r.tool_vectors.T).topk(k).indices
    return [[r.tools[i].id for i in row] for row in top.tolist()]


QUERIES = [f"{w} {v}" for w in WORDS for v in ("today", "near me", "price")]


# ---- the catalog generator --------------------------------------------------------------------
def test_scale_catalog_nests_every_size_and_keeps_every_id_and_text_distinct(data_root):
    sources = ["metatool", "toollinkos"]
    small, needle = scale_catalog(1000, data_root, sources=sources)
    large, _ = scale_catalog(4000, data_root, sources=sources)
    assert [t.id for t in small] == [t.id for t in large[:1000]]  # a smaller catalog is a prefix
    assert [t.id for t in large[:len(needle.tools)]] == [t.id for t in needle.tools]
    assert len({t.id for t in large}) == 4000 and len({t.document() for t in large}) == 4000
    real = [t for t in large if t.id.startswith("real/")]
    assert {t.id.split("/")[1] for t in real} == set(sources) and len(real) < 4000 - 464
    mixed = [t for t in large if t.id.startswith("mix/")]
    assert mixed and mixed[0].id == "mix/0" and len(mixed) == 4000 - 464 - len(real)
    by_text = {(t.name, t.description) for t in real}
    assert all((t.name, t.description) in by_text for t in mixed)  # recombined from real tools' text
    again, _ = scale_catalog(4000, data_root, sources=sources)
    assert [t.document() for t in again] == [t.document() for t in large]  # deterministic
    needle_docs = {t.document() for t in needle.tools}
    assert not any(t.document() in needle_docs for t in large[464:])


def test_scale_catalog_refuses_a_size_below_the_needle(data_root):
    from toolgraph.errors import ConfigError

    with pytest.raises(ConfigError, match="smaller than the needle catalog"):
        scale_catalog(100, data_root, sources=["metatool"])


# ---- FAISS indexes ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["faiss-hnsw", "faiss-ivf"])
def test_ann_finds_the_exact_neighbours_and_round_trips_without_a_rebuild(kind, tiny_bert_dir, tmp_path, monkeypatch):
    r = _dense(tiny_bert_dir, kind, ivf_lists=8, nprobe=8)
    r.index(_tools(400))
    assert r._ann is not None and r._ann.kind == kind
    found = r.retrieve(QUERIES, 10).ids
    exact = _exact_top(r, QUERIES, 10)
    recall = sum(len(set(a) & set(b)) for a, b in zip(found, exact)) / (10 * len(QUERIES))
    assert recall >= 0.95, recall
    r.save(tmp_path / "idx")
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert {"ann.faiss", "ann.json"} <= set(json.dumps(manifest).replace('"', " ").split())
    monkeypatch.setattr(AnnIndex, "build", lambda *a: pytest.fail("a saved ANN index was rebuilt on load"))
    loaded = Retriever.load(tmp_path / "idx")
    assert loaded.retrieve(QUERIES, 10).ids == found


def test_add_and_remove_tools_encode_only_new_tools_and_update_the_ann_in_place(tiny_bert_dir, monkeypatch):
    r = _dense(tiny_bert_dir, "faiss-hnsw")
    r.index(_tools(300))
    rows = r._ann.index.ntotal
    monkeypatch.setattr(AnnIndex, "build", lambda *a: pytest.fail("add/remove rebuilt the ANN index"))
    r.add_tools(_tools(20, start=300))
    assert r.encoded == 20 and r._ann.index.ntotal == rows + 20
    r.remove_tools([f"t{i}" for i in range(0, 300, 10)])  # 30 of 320: under compact_at
    assert r.encoded == 0 and len(r._ann.masked) == 30
    gone = {f"t{i}" for i in range(0, 300, 10)}
    found = r.retrieve(QUERIES, 10).ids
    assert not gone & {t for row in found for t in row}
    exact = _exact_top(r, QUERIES, 10)
    assert sum(len(set(a) & set(b)) for a, b in zip(found, exact)) / (10 * len(QUERIES)) >= 0.95
    # a changed tool is encoded again and its old row masked
    changed = Tool("t1", "renamed tool", "now it books trains")
    r.remove_tools(["t1"])
    r.add_tools([changed])
    assert r.encoded == 1 and len(r._ann.masked) == 31
    assert r.search(changed.document(), 1)[0].id == "t1"  # its own text finds it: the new vector is searched
    assert r.search(changed.document(), 1)[0].tool == changed  # and the hit is the new tool, not a cached old one


def test_many_removals_compact_the_ann_index(tiny_bert_dir):
    r = _dense(tiny_bert_dir, "faiss-ivf", compact_at=0.2, ivf_lists=4)
    r.index(_tools(200))
    r.remove_tools([f"t{i}" for i in range(60)])  # 30 %: past compact_at, rebuilt over the 140 left
    assert r._ann.index.ntotal == 140 and not r._ann.masked


def test_auto_is_exact_up_to_the_threshold_then_approximate(tiny_bert_dir):
    r = _dense(tiny_bert_dir, "auto", auto_above=250)
    r.index(_tools(250))
    assert r.index_kind() == "exact" and r._ann is None
    r.add_tools(_tools(1, start=250))
    assert r.index_kind() == "faiss-hnsw" and r._ann.index.ntotal == 251


def test_a_changed_encoder_re_encodes_every_tool(tiny_bert_dir):
    r = _dense(tiny_bert_dir)
    r.index(_tools(30))
    with torch.no_grad():
        next(r.encoder.parameters()).add_(0.5)  # training moved the weights: no old vector is reused
    r.index(_tools(31))
    assert r.encoded == 31


# ---- chunked encoding -------------------------------------------------------------------------
def _fake_encode(texts: list[str]) -> torch.Tensor:
    return torch.tensor([[float(len(t)), float(sum(map(ord, t)) % 97)] for t in texts])


SLOW = textwrap.dedent("""
    import sys, time, torch
    from toolgraph.retrieval.chunks import encode_in_chunks
    def slow(texts):
        time.sleep(0.3)
        return torch.tensor([[float(len(t)), float(sum(map(ord, t)) % 97)] for t in texts])
    texts = [f"text number {i}" for i in range(200)]
    encode_in_chunks(texts, slow, sys.argv[1], "fp", size=10, progress=False)
""")


def test_chunked_encoding_resumes_after_kill_9(tmp_path):
    folder = tmp_path / "chunks"
    proc = subprocess.Popen([sys.executable, "-c", SLOW, str(folder)])
    deadline = time.monotonic() + 120
    while len(list(folder.glob("chunk-*.safetensors"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    written = len(list(folder.glob("chunk-*.safetensors")))
    assert 3 <= written < 20
    calls = []
    texts = [f"text number {i}" for i in range(200)]
    out = encode_in_chunks(texts, lambda t: calls.append(len(t)) or _fake_encode(t), folder, "fp", size=10,
                           progress=False)
    assert len(calls) == 20 - written  # only the chunks the killed run had not finished
    assert torch.equal(out, _fake_encode(texts))
    again = []
    encode_in_chunks(texts, lambda t: again.append(1) or _fake_encode(t), folder, "other-encoder", size=10,
                     progress=False)
    assert len(again) == 20  # another encoder's chunks are never reused


RANK = textwrap.dedent("""
    import sys, torch
    from toolgraph.retrieval.chunks import encode_in_chunks, rank_and_world
    texts = [f"text number {i}" for i in range(95)]
    rank, world = rank_and_world()
    out = encode_in_chunks(texts, lambda t: torch.tensor([[float(len(x)), float(sum(map(ord, x)) % 97)] for x in t]),
                           sys.argv[1], "fp", size=10, progress=False)
    if rank == 0:
        torch.save(out, sys.argv[2])
""")


def test_two_torchrun_ranks_split_the_chunks_and_rank_0_assembles_them(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    torchrun = Path(sys.executable).with_name("torchrun")
    subprocess.run([str(torchrun), "--standalone", "--nproc_per_node=2", str(script), str(tmp_path / "c"),
                    str(tmp_path / "out.pt")], check=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    texts = [f"text number {i}" for i in range(95)]
    assert torch.equal(torch.load(tmp_path / "out.pt"), _fake_encode(texts))
    assert len(list((tmp_path / "c").glob("chunk-*.safetensors"))) == 10


def test_rank_0_encodes_the_chunks_of_a_rank_that_never_came(tmp_path):
    texts = [f"text number {i}" for i in range(40)]
    out = encode_in_chunks(texts, _fake_encode, tmp_path, "fp", size=10, rank=0, world=2, progress=False,
                           patience=0.5)
    assert torch.equal(out, _fake_encode(texts))


# ---- index sync over an ANN index ---------------------------------------------------------------
def _catalog(folder: Path, tools: list[Tool]) -> Path:
    from toolgraph.data.formats import write_dataset
    from toolgraph.data.schema import ToolDataset

    return write_dataset(ToolDataset("c", tools, []), folder)


def _spec(tiny_bert_dir, **extra) -> dict:
    return {"name": "dense", "encoder": {"name": str(tiny_bert_dir), "cache_dir": None}, "index": "faiss-hnsw",
            "progress": False, **extra}


def test_sync_updates_an_hnsw_index_in_place_and_encodes_only_what_changed(tiny_bert_dir, tmp_path):
    from toolgraph.sync import encode_folder, sync_index

    tools = _tools(200)
    sync_index(_catalog(tmp_path / "v1", tools), tmp_path / "idx", _spec(tiny_bert_dir))
    counts = sync_index(_catalog(tmp_path / "v2", tools[1:] + _tools(1, start=200)), tmp_path / "idx")
    assert counts["encoded"] == 1 and counts["added"] == 1 and counts["removed"] == 1
    meta = json.loads((tmp_path / "idx" / "ann.json").read_text())  # the base's index file, as it was
    assert meta["kind"] == "faiss-hnsw" and len(meta["rows"]) == 200 and counts["delta"] == {"tools": 1, "removed": 1}
    served = Retriever.load(tmp_path / "idx")  # the delta's row added, the removed one masked
    assert len(served._ann.row_ids) == 201 and len(served._ann.masked) == 1
    assert "t0" not in {t for row in served.retrieve(QUERIES, 10).ids for t in row}
    assert served.search(_tools(1, start=200)[0].document(), 1)[0].id == "t200"
    assert not encode_folder((tmp_path / "idx").resolve()).exists()  # the chunks go once the index is in place


SYNC = textwrap.dedent("""
    import sys, json
    from toolgraph.sync import sync_index
    print(json.dumps(sync_index(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))))
""")


def test_a_sync_killed_while_encoding_resumes_from_its_chunks(tiny_bert_dir, tmp_path, monkeypatch):
    from toolgraph.retrieval import dense
    from toolgraph.sync import encode_folder, sync_index

    catalog = _catalog(tmp_path / "cat", _tools(6000))
    spec = _spec(tiny_bert_dir, chunk_size=200, batch_size=8)
    chunks = encode_folder((tmp_path / "idx").resolve())
    proc = subprocess.Popen([sys.executable, "-c", SYNC, str(catalog), str(tmp_path / "idx"), json.dumps(spec)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while len(list(chunks.glob("chunk-*.safetensors"))) < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(list(chunks.glob("chunk-*.safetensors")))
    assert 3 <= done < 30 and not (tmp_path / "idx").exists()  # killed mid-encoding: no index yet
    encoded = []
    real = dense.encode_texts
    monkeypatch.setattr(dense, "encode_texts", lambda enc, tok, texts, *a, **k: encoded.append(len(texts))
                        or real(enc, tok, texts, *a, **k))
    counts = sync_index(catalog, tmp_path / "idx", spec)
    # only what the killed sync had not encoded, and the one query a new index answers before it is saved
    assert counts["tools"] == 6000 and sum(encoded) == 6000 - 200 * done + 1
    fresh = DenseRetriever(DenseConfig(encoder={"name": str(tiny_bert_dir), "cache_dir": None}, progress=False))
    fresh.index(_tools(6000))
    assert torch.allclose(Retriever.load(tmp_path / "idx").tool_vectors, fresh.tool_vectors, atol=1e-5)


def test_torchrun_splits_a_sync_s_encoding_over_two_ranks(tiny_bert_dir, tmp_path):
    catalog = _catalog(tmp_path / "cat", _tools(1200))
    config = tmp_path / "retriever.yaml"
    config.write_text(json.dumps({"retriever": _spec(tiny_bert_dir, chunk_size=100)}))
    torchrun = Path(sys.executable).with_name("torchrun")
    out = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node=2", "-m", "toolgraph.cli", "index", "sync",
                          str(catalog), "--index", str(tmp_path / "idx"), "--retriever-config", str(config)],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    assert {x.get("helper") for x in lines} == {None, 1}  # rank 0 synced, rank 1 helped
    main = next(x for x in lines if "helper" not in x)
    assert main["tools"] == 1200 and main["encoded"] == 1200
    fresh = DenseRetriever(DenseConfig(encoder={"name": str(tiny_bert_dir), "cache_dir": None}, progress=False))
    fresh.index(_tools(1200))
    assert torch.allclose(Retriever.load(tmp_path / "idx").tool_vectors, fresh.tool_vectors, atol=1e-5)
