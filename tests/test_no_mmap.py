"""Issue 20, finding 3: a loaded retriever keeps no tensor memory-mapped from its files.

safetensors' ``load_file`` and transformers' ``from_pretrained`` leave tensors backed by a mapping
of the file; when the file is cut or rewritten in place (``cp`` over it, ``rsync --inplace``)
while a server still uses them, the process dies with SIGBUS. Each check runs in a subprocess, so
that a SIGBUS shows up as a failed test (with the output so far), not as a crashed pytest."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from saved_retrievers import KINDS, QUERIES, build

import toolgraph
from toolgraph.errors import DataError

REPO = Path(__file__).resolve().parents[1]

# load each folder, answer, then cut every safetensors file below the folder (and the embedding
# cache) to a few bytes in place, and answer again: the same ids and scores, no crash
SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import torch
    import toolgraph
    from toolgraph.retrieval import Retriever

    def weights(obj, depth=0):
        # every parameter and buffer of the modules the retriever holds (members included), as bytes
        out = []
        for name, v in sorted(vars(obj).items()):
            if isinstance(v, torch.nn.Module):
                out += [t.detach().contiguous().view(torch.uint8).numpy().tobytes()
                        for t in [*v.parameters(), *v.buffers()]]
            elif isinstance(v, Retriever) and depth < 3:
                out += weights(v, depth + 1)
        return out

    jobs = json.loads(sys.argv[1])
    queries = json.loads(sys.argv[2])
    for job in jobs:
        r = toolgraph.load(job["folder"])
        before = r.retrieve(queries, 3)
        r.index(r.tools)  # every tool vector read once through the embedding cache, if any
        loaded = weights(r)  # the encoders and networks loaded from the folder
        assert loaded, job["kind"]
        for root in [job["folder"], *job["also"]]:
            for p in sorted(Path(root).rglob("*.safetensors")):
                with open(p, "r+b") as f:  # in place, as cp or rsync --inplace rewrite a file
                    f.truncate(0)
                    f.write(b"\\0" * 16)
        assert weights(r) == loaded, job["kind"]  # every weight page still readable, and unchanged
        r.index(r.tools)
        after = r.retrieve(queries, 3)
        assert after.ids == before.ids, (job["kind"], before.ids, after.ids)
        assert torch.equal(after.scores, before.scores), job["kind"]
        print("ok", job["kind"], flush=True)
""")


def _run(jobs: list[dict]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(jobs), json.dumps(QUERIES)], env=env,
                          capture_output=True, text=True, timeout=300)


def _check(proc: subprocess.CompletedProcess, kinds: list[str]) -> None:
    if proc.returncode != 0:
        how = "killed by SIGBUS" if proc.returncode == -7 else f"exit {proc.returncode}"
        pytest.fail(f"the loaded retriever did not survive its files being rewritten ({how}); "
                    f"stdout: {proc.stdout!r}; stderr tail: {proc.stderr[-2000:]!r}")
    assert proc.stdout.split() == [w for k in kinds for w in ("ok", k)]


def test_dense_index_keeps_answering_when_its_files_are_rewritten_in_place(tiny_bert_dir, tmp_path):
    """The issue's case: a live dense index whose vectors file (and exported encoder weights, and
    embedding-cache shards) are overwritten in place by cp / rsync --inplace."""
    cache = tmp_path / "cache"
    r = build("dense", tiny_bert_dir, cache_dir=str(cache))
    r.save(tmp_path / "dense")
    assert (tmp_path / "dense" / "encoder" / "model.safetensors").is_file() and list(cache.rglob("*.safetensors"))
    _check(_run([{"kind": "dense", "folder": str(tmp_path / "dense"), "also": [str(cache)]}]), ["dense"])


def test_every_retriever_with_saved_tensors_reads_them_into_memory(tiny_bert_dir, tmp_path):
    """agents.py, classifier.py, gnn.py, losemb.py, rerankers.py (and Tool2Vec): the same check."""
    kinds = [k for k in KINDS if k != "dense"]
    jobs = []
    for kind in kinds:
        cache = tmp_path / f"cache-{kind}"
        build(kind, tiny_bert_dir, cache_dir=str(cache)).save(tmp_path / kind)
        jobs.append({"kind": kind, "folder": str(tmp_path / kind), "also": [str(cache)]})
    _check(_run(jobs), kinds)


def test_read_tensors_owns_its_memory_and_names_a_cut_file(tmp_path):
    import torch
    from safetensors.torch import save_file

    from toolgraph.nn.storage import read_tensors

    path = tmp_path / "v.safetensors"
    save_file({"v": torch.arange(6.0).reshape(2, 3)}, str(path))
    t = read_tensors(path)["v"]
    path.write_bytes(path.read_bytes()[:20])  # cut short
    assert t.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    with pytest.raises(DataError, match=r"v\.safetensors: not a valid safetensors file.*re-save"):
        read_tensors(path)
    with pytest.raises(DataError, match=r"missing\.safetensors: missing"):
        read_tensors(tmp_path / "missing.safetensors")


def test_own_memory_keeps_tied_weights_tied():
    import torch

    from toolgraph.nn.storage import own_memory

    emb = torch.nn.Embedding(5, 3)
    head = torch.nn.Linear(3, 5, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    before = emb.weight.data_ptr()
    own_memory(model)
    assert model["emb"].weight is model["head"].weight and model["emb"].weight.data_ptr() != before


def test_saved_folder_loads_with_toolgraph_load(tiny_bert_dir, tmp_path):
    r = build("dense", tiny_bert_dir)
    r.save(tmp_path / "d")
    assert toolgraph.load(tmp_path / "d").retrieve(QUERIES, 3).ids == r.retrieve(QUERIES, 3).ids
