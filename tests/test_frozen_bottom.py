"""The frozen bottom as one component (nn.frozen.FrozenBottom + FrozenBottomConfig), declared by the
bi-encoder, the MLC and the refiner; its activation cache is ``model.states_dir`` in all three (the
bi-encoder's and MLC's ``model.cache_dir`` of older configs and checkpoints loads into it)."""

import pytest
import torch
from transformers import AutoTokenizer, BertModel

from toolgraph.config import load_config
from toolgraph.errors import ConfigError
from toolgraph.nn.encoder import TextEncoder
from toolgraph.nn.frozen import FrozenBottom, FrozenBottomConfig, PackedStates
from toolgraph.training import TrainConfig

TEXTS = ["get the weather in paris", "book a flight to rome", "convert dollars to euros", "play jazz"]


class _DataModule:
    tokenize_train = True


def _trainable(backbone) -> set[str]:
    return {n for n, p in backbone.named_parameters() if p.requires_grad}


def test_off_changes_nothing(tiny_bert_dir):
    backbone = BertModel.from_pretrained(tiny_bert_dir)
    frozen = FrozenBottom(FrozenBottomConfig(), backbone)  # freeze_layers: 0
    dm = _DataModule()
    frozen.serve(dm, queries=(backbone, TEXTS, 16))
    frozen.build(AutoTokenizer.from_pretrained(tiny_bert_dir), 8, "cpu")
    assert not frozen and dm.tokenize_train and not frozen.states
    assert _trainable(backbone) == {n for n, _ in backbone.named_parameters()}


def test_freezes_each_backbone_once_serves_indices_and_encodes_as_the_states(tiny_bert_dir, tmp_path):
    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    query, doc = BertModel.from_pretrained(tiny_bert_dir), BertModel.from_pretrained(tiny_bert_dir)
    frozen = FrozenBottom(FrozenBottomConfig(freeze_layers=1, states_dir=str(tmp_path)), query, doc, query)
    for backbone in (query, doc):
        trainable = _trainable(backbone)
        assert any(n.startswith("encoder.layer.1.") for n in trainable)
        assert not any(n.startswith(("embeddings.", "encoder.layer.0.")) for n in trainable)
    dm = _DataModule()
    frozen.serve(dm, queries=(query, TEXTS, 16), tools=(doc, TEXTS[:2], 12))
    assert not dm.tokenize_train  # the cached states replace tokens
    with pytest.raises(RuntimeError, match="no states of 'queries'"):
        frozen.encode("queries", TextEncoder(query), [0], "cpu")
    logged = []
    frozen.build(tok, 8, "cpu", logged.append)
    assert len(frozen.states["queries"]) == 4 and len(frozen.states["tools"]) == 2
    assert logged and "states of 4 queries and 2 tools" in logged[0]
    assert len(list(tmp_path.glob("states-*.pt"))) == 2  # one file per max length (the key holds it)
    enc = TextEncoder(query).eval()
    want = PackedStates.build(query, tok, TEXTS, 1, 16).encode(enc, [2, 0], 1)
    assert torch.allclose(frozen.encode("queries", enc, torch.tensor([2, 0]), "cpu"), want, atol=1e-6)
    hidden, mask = frozen.batch("tools", [1], "cpu")
    assert hidden.shape[:2] == mask.shape and mask.sum() == len(tok(TEXTS[1])["input_ids"])


def test_a_depth_the_backbone_lacks_is_refused(tiny_bert_dir):
    with pytest.raises(ConfigError, match="model.freeze_layers: 2 must be in"):
        FrozenBottom(FrozenBottomConfig(freeze_layers=2), BertModel.from_pretrained(tiny_bert_dir))


@pytest.mark.parametrize("task", ["bi_encoder", "tool2vec", "mlc", "refiner"])
def test_every_task_with_a_frozen_bottom_has_the_same_two_keys(task):
    from toolgraph.registry import TASKS

    cfg = load_config(TrainConfig, [], [f"model.name={task}", "model.freeze_layers=1", "model.states_dir=/tmp/st"])
    assert isinstance(cfg.model, FrozenBottomConfig) and issubclass(TASKS.get(task).Config, FrozenBottomConfig)
    assert (cfg.model.freeze_layers, cfg.model.states_dir) == (1, "/tmp/st")


@pytest.mark.parametrize("task", ["bi_encoder", "tool2vec", "mlc"])
def test_the_old_cache_dir_key_loads_as_states_dir(task):
    """Configs and checkpoints written before the rename (``model.cache_dir`` was the activation cache
    of the bi-encoder and the MLC) load to the same setting; setting both names is refused."""
    old = {"model": {"name": task, "freeze_layers": 1, "cache_dir": "/tmp/old"}}
    for cfg in (load_config(TrainConfig, [old]), load_config(TrainConfig, [], [f"model.name={task}",
                                                                               "model.cache_dir=null"])):
        assert not hasattr(cfg.model, "cache_dir")
    assert load_config(TrainConfig, [old]).model.states_dir == "/tmp/old"
    assert load_config(TrainConfig, [], [f"model.name={task}", "model.cache_dir=null"]).model.states_dir is None
    assert load_config(TrainConfig, [old], ["model.states_dir=/tmp/new"]).model.states_dir == "/tmp/new"  # later wins
    with pytest.raises(ConfigError, match="states_dir"):  # one source with both names
        load_config(TrainConfig, [{"model": {**old["model"], "states_dir": "/tmp/new"}}])


def test_the_refiners_cache_dir_stays_its_embedding_cache():
    cfg = load_config(TrainConfig, [], ["model.name=refiner", "model.cache_dir=/tmp/emb", "model.states_dir=/tmp/st"])
    assert (cfg.model.cache_dir, cfg.model.states_dir) == ("/tmp/emb", "/tmp/st")


def test_tool2vec_refuses_a_frozen_bottom(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    """Its query-pair batches carry tokens, never states: training crashed on the first batch before."""
    from conftest import tiny_train_overrides

    from toolgraph.training import train

    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path / "run", steps=2)
    with pytest.raises(ValueError, match="freeze_layers=0"):
        train(load_config(TrainConfig, [], [*over, "model.name=tool2vec", "model.freeze_layers=1"]))


@pytest.mark.parametrize("kind", ["bert", "mpnet"])
def test_top_layers_over_the_cached_bottom_are_the_full_forward(kind, tiny_bert_dir):
    """Layers k: over the bottom's states give the backbone's own output on every real token, in a padded
    batch. MPNet's encoder computes one relative-position bias for all its layers; without it the top
    layers would run (and train) on different attention from the model they export."""
    from transformers import MPNetConfig, MPNetModel

    from toolgraph.nn.frozen import bottom_states, run_layers

    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    torch.manual_seed(0)
    if kind == "bert":
        backbone = BertModel.from_pretrained(tiny_bert_dir)
    else:
        backbone = MPNetModel(MPNetConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=2, intermediate_size=64, max_position_embeddings=130,
                                          pad_token_id=tok.pad_token_id), add_pooling_layer=False)
        with torch.no_grad():  # random init leaves the bias near zero; make it matter
            backbone.encoder.relative_attention_bias.weight.normal_(0, 2.0)
    backbone.eval()
    batch = tok(TEXTS + ["a much longer request that needs the whole width of the batch to fit it"],
                padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        full = backbone(input_ids=ids, attention_mask=mask).last_hidden_state
        top = run_layers(backbone, bottom_states(backbone, ids, mask, 1), mask, 1)
    real = mask.bool()
    assert (mask == 0).any()  # the batch is padded
    torch.testing.assert_close(top[real], full[real], atol=1e-5, rtol=1e-5)
