"""The exported encoder loads in the real sentence-transformers without a load report and gives the
same vectors (issue 43, item 9): toolgraph drops a BERT's unused pooler, and the export tells
sentence-transformers to build the model the same way, so no "pooler.dense MISSING ... newly
initialized" report is printed. Loaded in a fresh process: toolgraph's own loading lowers the
transformers log level, which would hide the report in this one."""

import json
import os
import subprocess
import sys

import pytest
import torch

from toolgraph.nn.encoder import TextEncoder, load_backbone
from toolgraph.nn.export import export_sentence_transformer
from toolgraph.retrieval.encode import encode_texts

pytest.importorskip("sentence_transformers")

TEXTS = ["book a flight from Boston to Rome", "seven day weather forecast", "convert 10 USD to EUR"]

LOAD = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING)  # what a user's script with logging set up would print
from sentence_transformers import SentenceTransformer
model = SentenceTransformer(sys.argv[1], device="cpu")
vectors = model.encode(json.loads(sys.argv[2]), normalize_embeddings=False, convert_to_numpy=True)
print(json.dumps(vectors.tolist()))
"""


@pytest.mark.parametrize("pooling,normalize", [("mean", True), ("cls", False)])
def test_sentence_transformers_loads_the_export_silently_with_the_same_vectors(tiny_bert_dir, tmp_path,
                                                                               pooling, normalize):
    backbone, tokenizer = load_backbone(str(tiny_bert_dir))
    assert getattr(backbone, "pooler", 0) is None  # toolgraph's BERT has no pooler
    encoder = TextEncoder(backbone, pooling, normalize).eval()
    folder = export_sentence_transformer(encoder, tokenizer, tmp_path / "encoder", 64)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_VERBOSITY")}
    done = subprocess.run([sys.executable, "-c", LOAD, str(folder), json.dumps(TEXTS)], capture_output=True,
                          text=True, env={**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for alarm in ("MISSING", "newly initialized", "LOAD REPORT", "TRAIN this model", "Consider training"):
        assert alarm not in done.stderr and alarm not in done.stdout, done.stderr[-3000:]
    theirs = torch.tensor(json.loads(done.stdout.strip().splitlines()[-1]))
    ours = encode_texts(encoder, tokenizer, TEXTS, 8, 64, torch.device("cpu"), progress=False)
    assert theirs.shape == ours.shape and torch.allclose(ours, theirs, atol=1e-5)
    config = json.loads((folder / "sentence_bert_config.json").read_text())
    assert config["model_args"] == {"add_pooling_layer": False} and config["max_seq_length"] == 64


def test_a_backbone_with_its_pooler_is_exported_as_it_is(tiny_bert_dir, tmp_path):
    """Only a pooler that was dropped is declared dropped: a model built with one keeps the plain config."""
    from transformers import BertModel

    _, tokenizer = load_backbone(str(tiny_bert_dir))
    with_pooler = BertModel.from_pretrained(str(tiny_bert_dir))  # add_pooling_layer defaults to True
    assert with_pooler.pooler is not None
    folder = export_sentence_transformer(TextEncoder(with_pooler), tokenizer, tmp_path / "encoder", 64)
    assert "model_args" not in json.loads((folder / "sentence_bert_config.json").read_text())
