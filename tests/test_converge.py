"""Fast training ("Converge"): frozen bottom with cached activations, full-catalog contrastive loss."""

import json

import pytest
import torch
from conftest import tiny_train_overrides
from transformers import AutoTokenizer, BertConfig, BertModel

from toolgraph.config import load_config
from toolgraph.data.schema import Tool
from toolgraph.errors import ConfigError, DataError
from toolgraph.nn import frozen
from toolgraph.nn.encoder import TextEncoder
from toolgraph.nn.frozen import PackedStates, cache_key, cached_states, freeze_bottom
from toolgraph.nn.losses import false_negative_mask, full_catalog_nce, info_nce
from toolgraph.training import TrainConfig, train

TEXTS = ["find the weather in paris", "book a flight", "convert ten dollars to euro please right now",
         "x", "search hotels near the station with parking and breakfast included"]


@pytest.fixture(scope="module")
def tiny(tiny_bert_dir):
    """A 3-layer tiny BERT without dropout (training mode computes the same as eval mode)."""
    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    return BertModel(cfg, add_pooling_layer=False), tok


def _full(enc, tok, texts, max_length=16):
    t = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    return enc(t["input_ids"], t["attention_mask"])


@pytest.mark.parametrize("k", [1, 2])
def test_cached_states_give_the_same_logits_and_gradients(tiny, k):
    model, tok = tiny
    enc = TextEncoder(model)
    states = PackedStates.build(model, tok, TEXTS, k, 16, batch_size=2, dtype=torch.float32)
    tools = PackedStates.build(model, tok, TEXTS[::-1], k, 16, dtype=torch.float32)

    def loss_of(q, d):
        return info_nce(q, d, torch.arange(len(TEXTS)), 0.1)

    model.zero_grad()
    q, d = _full(enc, tok, TEXTS), _full(enc, tok, TEXTS[::-1])
    loss_of(q, d).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    qc = states.encode(enc, range(len(TEXTS)), k, chunk=2)
    dc = tools.encode(enc, range(len(TEXTS)), k, chunk=3)
    assert torch.allclose(q @ d.T / 0.1, qc @ dc.T / 0.1, atol=1e-4)  # logits
    loss_of(qc, dc).backward()
    cached = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    top = {n for n in grads if n.startswith("encoder.layer.") and int(n.split(".")[2]) >= k}
    assert set(cached) == top  # only the layers above K get gradients
    for n in top:
        assert torch.allclose(grads[n], cached[n], atol=1e-5), n


def test_fp16_states_stay_close(tiny):
    model, tok = tiny
    enc = TextEncoder(model)
    states = PackedStates.build(model, tok, TEXTS, 2, 16)
    assert states.flat.dtype == torch.float16 and states.flat.shape[0] == sum(states.lengths)
    with torch.no_grad():
        assert torch.allclose(states.encode(enc, range(5), 2), _full(enc, tok, TEXTS), atol=1e-2)


def test_freeze_bottom_stops_gradients_and_refuses_bad_depths(tiny):
    model, _ = tiny
    import copy

    m = copy.deepcopy(model)
    freeze_bottom(m, 2)
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("encoder.layer.2.") for n in trainable)
    for bad in (3, 7):
        with pytest.raises(ConfigError, match="model.freeze_layers"):
            freeze_bottom(copy.deepcopy(model), bad)
    with pytest.raises(ConfigError, match="BERT-style"):
        frozen.stack(torch.nn.Linear(2, 2))


def test_cache_is_keyed_and_read_back_and_bad_files_are_named(tiny, tmp_path, monkeypatch):
    model, tok = tiny
    a = cached_states(model, tok, TEXTS, 1, 16, tmp_path)
    files = list(tmp_path.glob("states-*.pt"))
    assert len(files) == 1
    build = PackedStates.build
    monkeypatch.setattr(PackedStates, "build", lambda *a, **k: pytest.fail("rebuilt although cached"))
    b = cached_states(model, tok, TEXTS, 1, 16, tmp_path)
    assert torch.equal(a.flat, b.flat) and a.lengths == b.lengths
    # a subset, in another order and with a repeat, is read from the same store: nothing is rebuilt
    sub = cached_states(model, tok, [TEXTS[2], TEXTS[0], TEXTS[2]], 1, 16, tmp_path)
    alone = build(model, tok, [TEXTS[2], TEXTS[0], TEXTS[2]], 1, 16)
    assert torch.equal(sub.flat, alone.flat) and sub.lengths == alone.lengths
    built = []
    monkeypatch.setattr(PackedStates, "build", lambda m, t, texts, *a, **k: built.append(list(texts)) or build(m, t, texts, *a, **k))
    more = cached_states(model, tok, ["a text never seen", *TEXTS], 1, 16, tmp_path)
    assert built == [["a text never seen"]]  # only what the store lacks runs through the bottom
    assert torch.equal(more.select(range(1, len(TEXTS) + 1)).flat, a.flat) and len(list(tmp_path.glob("states-*.pt"))) == 1
    key = cache_key(model, tok, 1, 16)
    assert key != cache_key(model, tok, 2, 16) and key != cache_key(model, tok, 1, 8)
    files[0].write_bytes(b"not a tensor file")
    with pytest.raises(DataError, match="activation cache") as e:
        cached_states(model, tok, TEXTS, 1, 16, tmp_path)
    assert files[0].name in str(e.value)
    torch.save({"flat": a.flat, "offsets": a.offsets}, files[0])
    with pytest.raises(DataError, match="does not fit"):
        PackedStates.load(files[0], 4, 32)


def test_full_catalog_single_positive_is_info_nce_over_the_catalog():
    torch.manual_seed(0)
    q, tools = torch.randn(4, 8), torch.randn(10, 8)
    gold = torch.tensor([[0, 3], [5, -1], [2, 7], [9, 1]])
    positive = torch.tensor([3, 5, 2, 1])
    mask = false_negative_mask(gold, torch.arange(10), positive)
    expected = info_nce(q, tools, positive, 0.1, mask)
    assert torch.allclose(full_catalog_nce(q, tools, gold, 0.1, positive), expected, atol=1e-6)


def _multi_positive_by_hand(logits, gold, negatives_of):
    rows = []
    for i, g in enumerate(gold.tolist()):
        g = [x for x in g if x >= 0]
        neg = [j for j in negatives_of if j not in g]
        rows.append(sum(-(logits[i, p] - torch.logsumexp(logits[i, [p] + neg], 0)) for p in g) / len(g))
    return torch.stack(rows).mean()


def test_full_catalog_multi_positive_and_hidden_tools():
    torch.manual_seed(1)
    q, tools = torch.randn(3, 8), torch.randn(6, 8)
    logits = q @ tools.T / 0.2
    gold = torch.tensor([[0, 3], [1, -1], [2, 4]])
    want = _multi_positive_by_hand(logits, gold, range(6))  # every gold a positive, the others negatives
    assert torch.allclose(full_catalog_nce(q, tools, gold, 0.2), want, atol=1e-5)
    # a tool the split hides from training (5) is removed from every query's negatives, nothing else changes
    allowed = torch.tensor([True, True, True, True, True, False])
    want = _multi_positive_by_hand(logits, gold, range(5))
    assert torch.allclose(full_catalog_nce(q, tools, gold, 0.2, None, allowed), want, atol=1e-5)
    tools2 = tools.clone()
    tools2[5] = q.sum(0) * 10  # however high a hidden tool scores, the loss does not see it
    assert torch.allclose(full_catalog_nce(q, tools2, gold, 0.2, None, allowed), want, atol=1e-5)


FAST = ["model.loss=full_catalog", "model.multi_positive=true", "model.freeze_layers=1", "model.refresh_every=3",
        "model.grad_tools=6"]


def test_fast_recipe_trains_end_to_end(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path / "run", steps=40)
    cfg = load_config(TrainConfig, [], over + FAST + [f"model.cache_dir={tmp_path / 'cache'}"])
    summary = train(cfg)
    assert summary["metrics"]["recall@5"] > 0.5  # chance is ~0.2 on 24 tools
    stores = list((tmp_path / "cache").glob("states-*.pt"))  # queries and tools: one store (same K and length)
    assert len(stores) == 1 and len(torch.load(stores[0], weights_only=True)["keys"]) > 24
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    t = res["training"]
    assert t["steps"] == 40 and t["train_seconds"] > 0 and t["examples_per_second"] > 0 and t["device"]
    import csv

    rows = [r for r in csv.DictReader((tmp_path / "run" / "logs" / "metrics.csv").open()) if r.get("val/recall@5")]
    seconds = [float(r["time/seconds"]) for r in rows]  # wall-clock time beside every validation
    assert len(seconds) >= 5 and seconds == sorted(seconds) and 0 < seconds[-1] <= t["train_seconds"]
    # the frozen bottom did not move: the exported encoder's embeddings equal the tiny model's
    ckpt = torch.load(summary["best_checkpoint"], map_location="cpu", weights_only=True)["state_dict"]
    base = BertModel.from_pretrained(tiny_bert_dir).state_dict()
    emb = "query_encoder.backbone.embeddings.word_embeddings.weight"
    assert torch.equal(ckpt[emb], base["embeddings.word_embeddings.weight"])
    assert torch.equal(ckpt["query_encoder.backbone.encoder.layer.0.output.dense.weight"],
                       base["encoder.layer.0.output.dense.weight"])
    assert not torch.equal(ckpt["query_encoder.backbone.encoder.layer.1.output.dense.weight"],
                           base["encoder.layer.1.output.dense.weight"])


def test_inductive_hidden_tools_are_never_training_negatives(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    from toolgraph.registry import TASKS

    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path / "run")
    cfg = load_config(TrainConfig, [], over + FAST + ["data.setting=inductive-30", "data.split=test"])
    task = TASKS.get("bi_encoder")(cfg)
    dm = task.datamodule_for()
    hidden = set(dm.ds.notes["unseen_tools"])
    assert hidden
    assert {t.id for t, ok in zip(dm.tools, task.contrastive.allowed.tolist()) if not ok} == hidden
    assert not hidden & {t for q in dm.train_queries for t in q.tools}


@pytest.mark.parametrize("override,needle", [
    (["model.multi_positive=true"], "model.multi_positive"),
    (["model.loss=full_catalog", "model.freeze_layers=2"], "model.freeze_layers"),
    (["model.loss=everything"], "model.loss"),
    (["model.refresh_every=0"], "model.refresh_every"),
])
def test_fast_config_errors_name_the_key(synthetic_dataset_dir, tiny_bert_dir, tmp_path, override, needle):
    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path / "run")
    with pytest.raises(ConfigError, match=needle):
        train(load_config(TrainConfig, [], over + override))


def test_pretokenized_collator_equals_tokenizing_every_batch(tiny_bert_dir):
    from toolgraph.data.text import ContrastiveCollator

    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    coll = ContrastiveCollator(tok, TEXTS, TEXTS[::-1], [[0], [1], [2], [3], [4]], 6, 9)
    for triples in ([(0, 1, -1), (4, 2, -1)], [(2, 0, 3), (3, 4, 1), (1, 3, 0)]):
        got = coll(triples)
        q = tok([TEXTS[t[0]] for t in triples], padding=True, truncation=True, max_length=6, return_tensors="pt")
        docs = [t[1] for t in triples] + ([t[2] for t in triples] if triples[0][2] >= 0 else [])
        d = tok([TEXTS[::-1][i] for i in docs], padding=True, truncation=True, max_length=9, return_tensors="pt")
        for k in ("input_ids", "attention_mask"):
            assert torch.equal(got["query"][k], q[k]) and torch.equal(got["doc"][k], d[k])
        assert got["query_index"].tolist() == [t[0] for t in triples]
    assert "query" not in ContrastiveCollator(tok, TEXTS, TEXTS, [[0]] * 5, 6, 9, tokenize=False)([(0, 1, -1)])


def test_length_buckets_cut_padding_and_keep_every_query():
    import random

    from toolgraph.data.text import ContrastiveBatchSampler

    rng = random.Random(0)
    gold = [[rng.randrange(300)] for _ in range(2000)]
    lengths = [rng.randrange(5, 120) for _ in range(2000)]

    def padding(sampler):
        plan = sampler.plan()
        return sum(max(lengths[q] for q, _, _ in b) * len(b) - sum(lengths[q] for q, _, _ in b) for b in plan), plan

    plain, plan_a = padding(ContrastiveBatchSampler(gold, 32, seed=1))
    bucketed, plan_b = padding(ContrastiveBatchSampler(gold, 32, seed=1, lengths=lengths))
    assert bucketed < plain / 4  # padded tokens
    for plan in (plan_a, plan_b):  # every query once, but for the last incomplete batch
        used = [q for b in plan for q, _, _ in b]
        assert len(used) == len(set(used)) > len(gold) - 32
    assert all(len({t for _, t, _ in b}) == len(b) for b in plan_b[:40])  # no tool twice in a batch


def test_grad_cache_trains_end_to_end(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    """GradCache learns (its gradients, accumulation and clipping: tests/test_gradcache.py)."""
    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path / "run", steps=30)
    summary = train(load_config(TrainConfig, [], over + ["model.grad_cache=5"]))
    assert summary["global_step"] == 30 and summary["metrics"]["recall@5"] > 0.5


def test_mlc_with_a_frozen_bottom_scores_as_without_and_trains(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    """MLC over cached states: the training logits equal the uncached network's (eval mode, fp32
    cache), batches carry indices only, and a run learns with the bottom left unchanged."""
    from toolgraph.registry import TASKS

    over = [o for o in tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path / "run", steps=40)
            if not o.startswith("model.temperature")]  # a bi-encoder key
    mlc = ["model.name=mlc", "model.freeze_layers=1", f"model.cache_dir={tmp_path / 'cache'}", "model.head_lr=5e-2",
           "model.dropout=0.0"]
    cfg = load_config(TrainConfig, [], over + mlc)
    task = TASKS.get("mlc")(cfg)
    dm = task.datamodule_for()
    batch = dm.train_collator()([(i, 0) for i in range(6)])
    assert "query" not in batch and batch["index"].tolist() == list(range(6))
    task.eval()
    states = PackedStates.build(task.encoder.backbone, task.tokenizer, task._query_texts, 1, 24, dtype=torch.float32)
    task._query_states = states
    tok = task.tokenizer([task._query_texts[i] for i in range(6)], padding=True, truncation=True, max_length=24,
                         return_tensors="pt")
    with torch.no_grad():
        direct = task.model(tok["input_ids"], tok["attention_mask"])
        cached = task.model.head(states.encode(task.encoder, range(6), 1))
    assert torch.allclose(direct, cached, atol=1e-4)

    summary = train(cfg)
    assert summary["metrics"]["recall@5"] > 0.5  # chance is ~0.2 on 24 tools
    assert len(list((tmp_path / "cache").glob("states-*.pt"))) == 1  # the queries
    ckpt = torch.load(summary["best_checkpoint"], map_location="cpu", weights_only=True)["state_dict"]
    base = BertModel.from_pretrained(tiny_bert_dir).state_dict()
    assert torch.equal(ckpt["encoder.backbone.encoder.layer.0.output.dense.weight"],
                       base["encoder.layer.0.output.dense.weight"])


@pytest.mark.parametrize("k", [1, 2])
def test_refiner_slots_above_a_cached_bottom_score_as_the_whole_network(tiny, k):
    """ToolRefiner with slots joining at layer K: the logits from cached bottom states equal the whole
    network's, the gradients of the layers above equal, and the query's padding changes nothing."""
    from toolgraph.nn.rerankers import ToolRefiner

    model, tok = tiny
    torch.manual_seed(1)
    net = ToolRefiner(model, 8, dropout=0.0, slot_layer=k)
    freeze_bottom(model, k)
    vecs, mask = torch.randn(len(TEXTS), 4, 8), torch.ones(len(TEXTS), 4, dtype=torch.bool)
    mask[3, 2:] = False
    t = tok(TEXTS, padding=True, truncation=True, max_length=16, return_tensors="pt")
    direct = net(t["input_ids"], t["attention_mask"], vecs, mask)
    states = PackedStates.build(model, tok, TEXTS, k, 16, dtype=torch.float32)
    hidden, qmask = states.batch(range(len(TEXTS)))
    cached = net.forward_states(hidden, qmask, vecs, mask)
    assert torch.allclose(direct, cached, atol=1e-4)
    grads = []
    for out in (direct, cached):
        net.zero_grad()
        (out * torch.arange(4.0)).masked_fill(~mask, 0).sum().backward(retain_graph=True)
        grads.append({n: p.grad.clone() for n, p in net.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys() and "backbone.encoder.layer.0.output.dense.weight" not in grads[0]
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-4), name
    alone = tok(TEXTS[3:4], return_tensors="pt")
    with torch.no_grad():
        assert torch.allclose(net(alone["input_ids"], alone["attention_mask"], vecs[3:4], mask[3:4])[0, :2],
                              direct[3, :2], atol=1e-5)


def test_learned_tool_offsets_start_at_zero_and_skip_tools_without_a_row(tiny):
    from toolgraph.nn.rerankers import ToolRefiner

    model, _ = tiny
    net = ToolRefiner(model, 8, dropout=0.0, learned_tools=5)
    vecs, rows = torch.randn(2, 3, 8), torch.tensor([[0, 4, -1], [2, 2, 1]])
    assert torch.equal(net.tool_inputs(vecs, rows), vecs)  # training starts from the given vectors
    with torch.no_grad():
        net.tool_offsets.weight.copy_(torch.arange(5.0).unsqueeze(1).expand(5, 8))
    out = net.tool_inputs(vecs, rows)
    assert torch.equal(out[0, 2], vecs[0, 2])  # no row: the vector alone
    assert torch.allclose(out - vecs, rows.clamp(min=0).float().unsqueeze(-1).expand(2, 3, 8) * (rows >= 0)[..., None])
    out.sum().backward()
    assert net.tool_offsets.weight.grad[:, 0].tolist() == [1.0, 1.0, 2.0, 0.0, 1.0]  # only the rows used
    assert torch.equal(ToolRefiner(model, 8).tool_inputs(vecs, rows), vecs)  # off: nothing added


def test_refiner_with_a_frozen_bottom_trains_exports_and_reloads(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    """freeze_layers on the refiner task: training batches carry indices only, the query states are
    cached once, the bottom stays unchanged, and the exported pipeline ranks as Lightning's test and as
    the checkpoint do. With learn_tool_vectors the per-tool offsets train, travel in the export, and a
    tool added after training gets its plain vector."""
    import toolgraph

    over = [o for o in tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path / "run", steps=40)
            if not o.startswith("model.")]
    over += ["model.name=refiner", f"model.encoder={tiny_bert_dir}", "model.first_stage=bm25", "model.cache_dir=null",
             "model.head_lr=1e-2", "model.vectors=description", f"model.vector_encoder={tiny_bert_dir}",
             "model.candidates=8", "model.eval_candidates=6", "model.freeze_layers=1",
             f"model.states_dir={tmp_path / 'cache'}", "model.first_stage_weight=0.3", "model.learn_tool_vectors=true"]
    summary = train(load_config(TrainConfig, [], over))
    assert len(list((tmp_path / "cache").glob("states-*.pt"))) == 1
    for key in ("recall@1", "recall@3", "ndcg@5"):
        assert summary["test"][f"test/{key}"] == pytest.approx(summary["metrics"][key], abs=1e-5)
    assert summary["metrics"]["recall@3"] > 0.5
    ckpt = torch.load(summary["best_checkpoint"], map_location="cpu", weights_only=True)["state_dict"]
    base = BertModel.from_pretrained(tiny_bert_dir).state_dict()
    assert torch.equal(ckpt["backbone.encoder.layer.0.output.dense.weight"], base["encoder.layer.0.output.dense.weight"])
    assert not torch.equal(ckpt["backbone.encoder.layer.1.output.dense.weight"],
                           base["encoder.layer.1.output.dense.weight"])
    offsets = ckpt["network.tool_offsets.weight"]
    assert offsets.abs().sum() > 0  # the per-tool offsets trained
    exported = toolgraph.load(tmp_path / "run")
    assert exported.reranker.config.slot_layer == 1 and exported.config.first_stage_weight == 0.3
    assert exported.reranker.config.learned_tools == [t.id for t in exported.tools]
    q = ["please tell me the weather and the pizza", "please tell me the taxi"]
    a, b = toolgraph.load(summary["best_checkpoint"]).retrieve(q, 5), exported.retrieve(q, 5)
    assert a.ids == b.ids and torch.allclose(a.scores, b.scores, atol=1e-4)
    saved = torch.load(summary["best_checkpoint"], map_location="cpu", weights_only=True)["state_dict"]
    assert torch.equal(exported.reranker.net().tool_offsets.weight.cpu(), saved["network.tool_offsets.weight"])
    new_tool = Tool(id="umbrella_shop", name="umbrella shop", description="buy an umbrella when it rains")
    exported.index([*exported.tools, new_tool])  # a tool the offsets never saw: scored from its vector alone
    rr, known = exported.reranker, exported.tools[0].id
    net, table = rr.net(), rr.vectors.tool_vectors
    tok = rr.tokenizer(["where can I buy an umbrella"], return_tensors="pt")
    for tool, learned in (("umbrella_shop", False), (known, True)):  # one candidate: slots see each other
        got = rr.rerank(["where can I buy an umbrella"], [[tool]])[0, 0].item()
        with torch.no_grad():
            plain = net(tok["input_ids"], tok["attention_mask"], table[[rr._row[tool]]].unsqueeze(0),
                        torch.ones(1, 1, dtype=torch.bool))[0, 0].item()
        assert (got != pytest.approx(plain, abs=1e-5)) == learned  # new tool: its vector alone
