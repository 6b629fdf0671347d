"""The static encoder (nn/static.py): distilled from a (tiny) transformer, saved as a model folder that
load_backbone and a dense retriever read, a text's vector the weighted mean of its tokens' rows."""

from __future__ import annotations

import json

import pytest
import torch

from toolgraph.data.formats import read_dataset
from toolgraph.errors import DataError
from toolgraph.nn.encoder import TextEncoder, load_backbone
from toolgraph.nn.static import StaticBackbone, token_vectors
from toolgraph.retrieval.base import Retriever
from toolgraph.retrieval.dense import DenseConfig, DenseRetriever
from toolgraph.retrieval.static import build_static


@pytest.fixture(scope="module")
def static_dir(tiny_bert_dir, tmp_path_factory):
    data = tmp_path_factory.mktemp("corpus")
    (data / "tools.jsonl").write_text("".join(json.dumps({"id": f"t{i}", "name": f"tool {i}",
                                                          "description": f"the weather in city {i}"}) + "\n"
                                              for i in range(20)))
    (data / "queries.jsonl").write_text(json.dumps({"id": "q", "text": "weather today", "tools": ["t1"]}) + "\n")
    return build_static(tmp_path_factory.mktemp("static") / "enc", source=str(tiny_bert_dir), corpus=(str(data),),
                        drop=2)


def test_the_table_is_the_transformer_s_token_outputs_centred_projected_and_weighted(tiny_bert_dir, static_dir):
    backbone, tok = load_backbone(str(static_dir))
    assert isinstance(backbone, StaticBackbone) and backbone.config.hidden_size == 32
    table = backbone.embeddings.weight
    assert table.shape == (len(tok), 32)
    assert torch.count_nonzero(table[tok.all_special_ids]) == 0  # [CLS] / [SEP] / [PAD] add nothing
    source, _ = load_backbone(str(tiny_bert_dir))
    raw = token_vectors(source, tok)
    centred = raw - raw.mean(0)
    word = tok.convert_tokens_to_ids("weather")  # frequent in the corpus: weighs less than an unseen token
    unseen = tok.convert_tokens_to_ids("zebra")
    cos = torch.nn.functional.cosine_similarity
    assert cos(table[word], centred[word], dim=0) > 0.5 and cos(table[unseen], centred[unseen], dim=0) > 0.5
    assert table[word].norm() / centred[word].norm() < table[unseen].norm() / centred[unseen].norm()
    meta = json.loads((static_dir / "config.json").read_text())["toolgraph_static"]
    assert meta["removed_components"] == 2 and meta["corpus_texts"] == 21


def test_a_text_vector_is_the_normalised_mean_of_its_token_rows(static_dir):
    backbone, tok = load_backbone(str(static_dir))
    enc = TextEncoder(backbone)
    batch = tok(["weather in paris", "book a flight"], padding=True, return_tensors="pt")
    out = enc(batch["input_ids"], batch["attention_mask"])
    table = backbone.embeddings.weight
    for row, ids, mask in zip(out, batch["input_ids"], batch["attention_mask"], strict=True):
        want = torch.nn.functional.normalize(table[ids[mask.bool()]].sum(0), dim=0)
        assert torch.allclose(row, want, atol=1e-6)


def test_a_dense_retriever_serves_it_saves_it_inside_and_loads_it(static_dir, tiny_dataset_dir, tmp_path):
    r = DenseRetriever(DenseConfig(encoder={"name": str(static_dir), "cache_dir": None}, progress=False))
    r.index(read_dataset(tiny_dataset_dir).tools)
    first = r.retrieve(["weather in paris"], 3)
    r.save(tmp_path / "idx")
    assert (tmp_path / "idx" / "encoder" / "static.safetensors").is_file()  # copied in: the folder travels
    loaded = Retriever.load(tmp_path / "idx")
    assert loaded.retrieve(["weather in paris"], 3).ids == first.ids


def test_a_table_that_does_not_fit_its_config_names_the_folder(static_dir, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(static_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["hidden_size"] = 64
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DataError, match="the table is .* but config.json says"):
        load_backbone(str(bad))


def test_the_cli_distils_one_with_weights_counted_on_the_real_catalogs(tiny_bert_dir, tmp_path, data_root):
    from toolgraph.cli import main

    assert main(["encoder", "static", "--out", str(tmp_path / "s"), "--from", str(tiny_bert_dir), "--drop", "4"]) == 0
    meta = json.loads((tmp_path / "s" / "config.json").read_text())["toolgraph_static"]
    assert meta["removed_components"] == 4 and meta["corpus_texts"] > 10_000 and "seal-tools" in meta["corpus"]
    r = DenseRetriever(DenseConfig(encoder={"name": str(tmp_path / "s"), "cache_dir": None}, progress=False))
    r.index(read_dataset(_tiny(tmp_path)).tools)
    assert len(r.retrieve(["weather"], 2).ids[0]) == 2


def _tiny(folder):
    (folder / "t").mkdir()
    (folder / "t" / "tools.jsonl").write_text(json.dumps({"id": "a", "name": "weather", "description": "x"}) + "\n"
                                              + json.dumps({"id": "b", "name": "flights", "description": "y"}) + "\n")
    (folder / "t" / "queries.jsonl").write_text("")
    return folder / "t"
