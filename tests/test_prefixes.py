"""Instruction-style prefixes (issue "General retriever", build item 4): ``model.query_prefix`` /
``model.tool_prefix`` reach every text the bi-encoder trains and evaluates on, travel with the exported
encoder as sentence-transformers ``prompts``, and the dense retriever applies a folder's prompts."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import tiny_train_overrides

from toolgraph.config import load_config
from toolgraph.data.schema import Tool
from toolgraph.errors import DataError
from toolgraph.retrieval.dense import DenseConfig, DenseRetriever
from toolgraph.retrieval.loading import load
from toolgraph.training import TrainConfig, train

PREFIXES = ["model.query_prefix='query: '", "model.tool_prefix='tool: '"]
FAST = ["model.loss=full_catalog", "model.multi_positive=true", "model.freeze_layers=1", "model.refresh_every=3",
        "model.grad_tools=6"]
TOOLS = [Tool("a", "get_weather", "returns weather information"), Tool("b", "get_flight", "books a flight")]


def test_prefixes_reach_every_training_and_evaluation_text(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    from toolgraph.registry import TASKS

    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path / "run")
    cfg = load_config(TrainConfig, [], over + FAST + PREFIXES)
    task = TASKS.get("bi_encoder")(cfg)
    dm = task.datamodule_for()
    assert all(t.startswith("tool: ") for t in dm.tool_texts)
    assert task._query_texts and all(q.startswith("query: ") for q in task._query_texts)  # the frozen-state cache
    collator = dm.train_collator()
    assert all(q.startswith("query: ") for q in collator.query_texts)
    loader = dm.val_dataloader()
    first = loader.dataset[0][0]
    assert first.startswith("query: ")
    assert not any(q.text.startswith("query: ") for q in dm.ds.queries)  # the dataset itself is unchanged


def test_the_exported_encoder_keeps_its_prompts_and_the_retriever_applies_them(synthetic_dataset_dir, tiny_bert_dir,
                                                                             tmp_path):
    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path / "run", steps=6)
    train(load_config(TrainConfig, [], over + FAST + PREFIXES + [f"model.cache_dir={tmp_path / 'cache'}"]))
    encoder = tmp_path / "run" / "retriever" / "encoder"
    saved = json.loads((encoder / "config_sentence_transformers.json").read_text())
    assert saved["prompts"] == {"query": "query: ", "document": "tool: "}
    card = (encoder / "README.md").read_text()
    assert 'prompt_name="query"' in card and "query `'query: '`" in card and "document `'tool: '`" in card
    queries = ["tell me the weather", "book a flight to Oslo"]

    def scores(**prefixes) -> torch.Tensor:
        r = DenseRetriever(DenseConfig(model=str(encoder), cache_dir=None, progress=False, **prefixes))
        r.index(TOOLS)
        return r.score(queries)

    by_folder = scores()  # the folder's prompts, applied by default
    assert torch.allclose(by_folder, scores(query_prefix="query: ", doc_prefix="tool: "), atol=1e-6)
    assert not torch.allclose(by_folder, scores(query_prefix="", doc_prefix=""), atol=1e-4)  # "" turns them off
    exported = load(tmp_path / "run" / "retriever")  # the run's own retriever: the same texts as in training
    exported.index(TOOLS)
    assert torch.allclose(exported.score(queries), by_folder, atol=1e-5)


def test_an_encoder_trained_without_prefixes_declares_no_prompts(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path / "run", steps=2)
    train(load_config(TrainConfig, [], over))
    assert not (tmp_path / "run" / "retriever" / "encoder" / "config_sentence_transformers.json").exists()
    r = DenseRetriever(DenseConfig(model=str(tmp_path / "run" / "retriever" / "encoder"), cache_dir=None))
    assert r.prefix("query") == "" and r.prefix("document") == ""


@pytest.mark.parametrize("content,needle", [
    ('{"prompts": ["query: "]}', "'prompts' must map prompt names to strings"),
    ('{"prompts": {"query": 3}}', "'prompts' must map prompt names to strings"),
    ("{not json", "not a readable sentence-transformers config"),
    ('["query: "]', "a sentence-transformers config is a JSON object, got list"),
])
def test_a_bad_prompts_file_fails_naming_it(tiny_bert_dir, tmp_path, content, needle):
    folder = tmp_path / "encoder"
    shutil.copytree(tiny_bert_dir, folder)
    (folder / "config_sentence_transformers.json").write_text(content)
    r = DenseRetriever(DenseConfig(model=str(folder), cache_dir=None, progress=False))
    with pytest.raises(DataError, match=needle) as err:
        r.index(TOOLS)
    assert "config_sentence_transformers.json" in str(err.value)
    explicit = DenseRetriever(DenseConfig(model=str(folder), cache_dir=None, progress=False, query_prefix="",
                                          doc_prefix=""))
    explicit.index(TOOLS)  # set prefixes never read the file
    assert explicit.score(["weather"]).shape == (1, 2)
