"""model.bm25_fusion: a bi-encoder trained as the dense side of the hybrid it is served in (dense + w x BM25,
min-max scores): the fused loss ranks as the hybrid, BM25 is read per dataset of a mixture, and a batch's
lexical scores are the catalog's BM25 of its queries."""

import pytest
import torch
from conftest import tiny_train_overrides

from toolgraph.config import TrainConfig, load_config
from toolgraph.data.schema import Tool
from toolgraph.errors import ConfigError
from toolgraph.nn.losses import FullCatalogNCE, full_catalog_nce
from toolgraph.retrieval.bm25 import BM25Config, BM25Retriever
from toolgraph.retrieval.fusion_model import normalise
from toolgraph.retrieval.lexical import CatalogBM25


def test_the_fused_loss_ranks_as_the_served_hybrid():
    """Logits dense + w x (dense range) x lexical order the catalog as min-max(dense) + w x lexical does, and
    the loss is InfoNCE over them; masked tools set no range; w = 0 is the plain loss."""
    torch.manual_seed(0)
    q, tools = torch.nn.functional.normalize(torch.randn(4, 8), dim=-1), torch.nn.functional.normalize(torch.randn(12, 8), dim=-1)
    gold = torch.tensor([[0, 3], [5, -1], [7, -1], [9, 2]])
    lexical = torch.rand(4, 12)
    allowed = torch.tensor([True] * 10 + [False] * 2)
    dense = q @ tools.T
    span = dense[:, :10].amax(1, keepdim=True) - dense[:, :10].amin(1, keepdim=True)  # over the allowed tools
    hybrid = normalise(dense, "minmax", allowed.expand(4, -1)) + 0.3 * lexical  # what the server ranks by
    fused = dense + 0.3 * span * lexical
    assert torch.equal(hybrid[:, :10].argsort(dim=1, stable=True), fused[:, :10].argsort(dim=1, stable=True))
    want = full_catalog_nce(q, tools, gold, 0.05, None, allowed)  # the plain loss, logits swapped for the fused
    got = full_catalog_nce(q, tools, gold, 0.05, None, allowed, lexical, 0.3)
    assert not torch.allclose(got, want)
    fused_logits = fused / 0.05
    valid = gold >= 0
    negative = allowed.expand(4, -1).clone()
    for row, tools_of in enumerate(gold.tolist()):
        negative[row, [t for t in tools_of if t >= 0]] = False
    lse_neg = torch.logsumexp(fused_logits.masked_fill(~negative, -1e30), 1)
    pos = fused_logits.gather(1, gold.clamp(min=0))
    per = torch.logaddexp(pos, lse_neg.view(-1, 1)) - pos
    assert torch.allclose(got, ((per * valid).sum(1) / valid.sum(1)).mean(), atol=1e-5)
    assert torch.allclose(full_catalog_nce(q, tools, gold, 0.05, None, allowed, lexical, 0.0), want)


def test_the_loss_module_refuses_a_batch_without_its_lexical_scores():
    loss_fn = FullCatalogNCE(0.1, multi_positive=True, lexical_weight=0.3)
    loss_fn.refresh(torch.randn(5, 4), 0)
    batch = {"gold": torch.tensor([[1, -1]]), "doc_tools": torch.tensor([1]), "positive": torch.tensor([0])}
    with pytest.raises(RuntimeError, match="no 'lexical' scores"):
        loss_fn(lambda r: torch.randn(len(r), 4), lambda r: torch.randn(len(r), 4), batch)


def test_catalog_bm25_scores_each_query_over_its_own_part_in_0_1():
    tools = [Tool(f"t{i}", name, desc) for i, (name, desc) in enumerate([
        ("get_weather", "weather forecast for a city"), ("book_flight", "book a flight ticket"),
        ("send_mail", "send an email message"), ("weather_alerts", "severe weather alerts"),
        ("play_song", "play a song by name")])]
    part = CatalogBM25(tools, [0, 0, 0, 1, 1])
    s = part.scores(["weather in paris", "nothing shared here"], group=0)
    assert s.shape == (2, 5) and (s[:, 3:] == 0).all()  # the other dataset's tools: no score
    assert s[0].argmax() == 0 and s[0].max() == 1 and s[0, :3].min() == 0  # min-max over its own part
    assert (s[1] == 0).all()  # no term in the catalog: no evidence, zeros (never NaN)
    bm25 = BM25Retriever(BM25Config())
    bm25.index(tools[3:])
    assert torch.allclose(part.scores(["weather in paris"], 1)[:, 3:], normalise(bm25.score(["weather in paris"]), "minmax"))


def test_a_training_batch_carries_its_queries_bm25_and_the_loss_fuses_it(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    from toolgraph.registry import TASKS

    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path / "run")
    full = ["model.loss=full_catalog", "model.multi_positive=true"]
    losses = {}
    for w in (0.0, 0.5):
        torch.manual_seed(0)
        task = TASKS.get("bi_encoder")(load_config(TrainConfig, [], over + full + [f"model.bm25_fusion={w}"]))
        dm = task.datamodule_for()
        batch = next(iter(dm.train_dataloader()))
        task.eval()  # no dropout: the two losses differ by the fusion alone
        losses[w] = float(task.compute_loss(batch).detach())
    texts = [dm.train_queries[i].text for i in batch["query_index"].tolist()]
    bm25 = BM25Retriever(BM25Config())
    bm25.index(dm.tools)
    assert torch.allclose(task.lexical.scores(texts), normalise(bm25.score(texts), "minmax"))
    assert losses[0.5] != pytest.approx(losses[0.0])


def test_bm25_fusion_needs_the_full_catalog_loss(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    from toolgraph.training import train

    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path / "run")
    with pytest.raises(ConfigError, match="model.bm25_fusion"):
        train(load_config(TrainConfig, [], over + ["model.bm25_fusion=0.3"]))
    with pytest.raises(ConfigError, match="model.bm25_fusion"):
        load_config(TrainConfig, [], over + ["model.loss=full_catalog", "model.bm25_fusion=-1"])
