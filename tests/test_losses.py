"""Contrastive loss pieces, without a model; and the cross-rank gather against one big batch."""

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from toolgraph.nn.losses import (
    ContrastiveLoss,
    FullCatalogNCE,
    InBatchNCE,
    false_negative_mask,
    full_catalog_nce,
    gather_no_grad,
    gather_with_grad,
    info_nce,
)


def test_false_negative_mask_masks_other_gold_tools_but_not_the_positive():
    gold = torch.tensor([[0, 2], [1, -1], [2, -1]])  # query 0 uses tools 0 and 2
    doc_tools = torch.tensor([0, 1, 2, 2])  # column 3 repeats tool 2 (e.g. from another rank)
    positive = torch.tensor([0, 1, 2])
    mask = false_negative_mask(gold, doc_tools, positive)
    assert mask.tolist() == [[False, False, True, True], [False, False, False, False], [False, False, False, True]]


def test_info_nce_equals_manual_cross_entropy_with_mask():
    g = torch.Generator().manual_seed(0)
    q = F.normalize(torch.randn(3, 8, generator=g), dim=1)
    d = F.normalize(torch.randn(5, 8, generator=g), dim=1)
    positive = torch.tensor([0, 1, 2])
    mask = torch.zeros(3, 5, dtype=torch.bool)
    mask[0, 3] = True
    loss = info_nce(q, d, positive, 0.1, mask)
    logits = q @ d.T / 0.1
    manual = []
    for i in range(3):
        keep = [j for j in range(5) if not mask[i, j]]
        manual.append(-(logits[i, positive[i]] - torch.logsumexp(logits[i, keep], 0)))
    assert loss.item() == pytest.approx(torch.stack(manual).mean().item(), rel=1e-5)


def test_masking_a_false_negative_lowers_the_loss():
    q = F.normalize(torch.tensor([[1.0, 0.0]]), dim=1)
    d = F.normalize(torch.tensor([[1.0, 0.1], [1.0, 0.0]]), dim=1)  # column 1 is also gold for q
    plain = info_nce(q, d, torch.tensor([0]), 0.05)
    masked = info_nce(q, d, torch.tensor([0]), 0.05, torch.tensor([[False, True]]))
    assert masked < plain


def _model_and_data():
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 4)
    x_q = torch.randn(8, 6)
    x_d = torch.randn(8, 6)
    gold = torch.tensor([[i, (i + 3) % 8] for i in range(8)])  # two gold tools per query
    doc_tools = torch.arange(8)
    return model, x_q, x_d, gold, doc_tools


def _loss(model, x_q, x_d, gold, doc_tools, positive, offset=0, gather=False, module=False):
    if module:  # the loss module a task trains with: it gathers and offsets by rank itself
        batch = {"gold": gold, "doc_tools": doc_tools, "positive": positive}
        return InBatchNCE(0.1, gather=gather)(lambda rows: F.normalize(model(x_q[rows]), dim=1),
                                              lambda rows: F.normalize(model(x_d[rows]), dim=1), batch)
    q = F.normalize(model(x_q), dim=1)
    d = F.normalize(model(x_d), dim=1)
    if gather:
        d, doc_tools = gather_with_grad(d), gather_no_grad(doc_tools)
        positive = positive + offset
    return info_nce(q, d, positive, 0.1, false_negative_mask(gold, doc_tools, positive))


def _worker(rank: int, world: int, port: int, out_path: str, module: bool = False) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    model, x_q, x_d, gold, doc_tools = _model_and_data()
    b = 8 // world
    sl = slice(rank * b, (rank + 1) * b)
    loss = _loss(model, x_q[sl], x_d[sl], gold[sl], doc_tools[sl], torch.arange(b), offset=rank * b, gather=True,
                 module=module)
    loss.backward()
    # what DDP does: average gradients over ranks
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    lt = loss.detach().clone()
    dist.all_reduce(lt)
    if rank == 0:
        torch.save({"loss": (lt / world).item(), "grads": [p.grad.clone() for p in model.parameters()]}, out_path)
    dist.barrier()
    dist.destroy_process_group()
    # skip C++ static destructors: gloo's background threads can abort a process at interpreter exit
    # ("terminate called without an active exception") after all the work above is done
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.distributed
@pytest.mark.parametrize("module", [False, True], ids=["functions", "InBatchNCE"])
def test_two_ranks_of_batch_b_equal_one_process_of_batch_2b(tmp_path, module):
    model, x_q, x_d, gold, doc_tools = _model_and_data()
    loss = _loss(model, x_q, x_d, gold, doc_tools, torch.arange(8))
    loss.backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]

    out_path = str(tmp_path / "rank0.pt")
    mp.spawn(_worker, args=(2, _free_port(), out_path, module), nprocs=2, join=True)
    out = torch.load(out_path, weights_only=True)
    assert out["loss"] == pytest.approx(loss.item(), rel=1e-5)
    for g, r in zip(out["grads"], ref_grads):
        assert torch.allclose(g, r, atol=1e-6)


def test_without_gather_the_negatives_shrink():
    """The trap the gather avoids: local-only negatives give a different (smaller) loss."""
    model, x_q, x_d, gold, doc_tools = _model_and_data()
    full = _loss(model, x_q, x_d, gold, doc_tools, torch.arange(8)).item()
    halves = [_loss(model, x_q[s], x_d[s], gold[s], doc_tools[s], torch.arange(4)).item()
              for s in (slice(0, 4), slice(4, 8))]
    assert sum(halves) / 2 < full


def test_category_averaged_loss_matches_hand_computation():
    """TGR eq. 2: each class's summed loss divided by N_k (its count in the batch)."""
    import math

    from toolgraph.nn.losses import category_averaged_ce

    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.5], [1.0, 1.0, 1.0], [0.0, 3.0, 0.0]])
    labels = torch.tensor([0, 1, 1, 1, 2])

    def ce(row, k):
        return -math.log(math.exp(row[k]) / sum(math.exp(v) for v in row))

    rows = logits.tolist()
    l0 = ce(rows[0], 0) / 1
    l1 = (ce(rows[1], 1) + ce(rows[2], 1) + ce(rows[3], 1)) / 3
    l2 = ce(rows[4], 2) / 1
    assert category_averaged_ce(logits, labels).item() == pytest.approx(l0 + l1 + l2, rel=1e-6)
    # weights scale each example's term; N_k still counts examples
    w = torch.tensor([1.0, 0.5, 1.0, 1.0, 2.0])
    l1w = (0.5 * ce(rows[1], 1) + ce(rows[2], 1) + ce(rows[3], 1)) / 3
    assert category_averaged_ce(logits, labels, w).item() == pytest.approx(l0 + l1w + 2 * l2, rel=1e-6)
    # dataset counts: N_k scaled to its expected count in a batch of 5 (counts 10/80/10 of 100)
    counts = torch.tensor([10.0, 80.0, 10.0])
    n = [10 * 5 / 100, 80 * 5 / 100, 10 * 5 / 100]
    expected = ce(rows[0], 0) / n[0] + (ce(rows[1], 1) + ce(rows[2], 1) + ce(rows[3], 1)) / n[1] + ce(rows[4], 2) / n[2]
    assert category_averaged_ce(logits, labels, class_counts=counts).item() == pytest.approx(expected, rel=1e-6)


def test_category_averaged_loss_ignores_absent_classes_and_equals_ce_when_balanced():
    from toolgraph.nn.losses import category_averaged_ce

    torch.manual_seed(0)
    logits = torch.randn(6, 3)
    labels = torch.tensor([0, 0, 2, 2, 0, 2])  # class 1 absent: no term, no NaN
    value = category_averaged_ce(logits, labels)
    assert torch.isfinite(value)
    balanced = torch.tensor([0, 1, 2, 0, 1, 2])
    # with equal counts, sum_k mean_k = K * mean over the batch
    assert category_averaged_ce(logits, balanced).item() == pytest.approx(
        3 * torch.nn.functional.cross_entropy(logits, balanced).item(), rel=1e-6)


def test_in_batch_loss_module_is_info_nce_over_the_batch_with_false_negatives_masked():
    model, x_q, x_d, gold, doc_tools = _model_and_data()
    want = _loss(model, x_q, x_d, gold, doc_tools, torch.arange(8))
    got = _loss(model, x_q, x_d, gold, doc_tools, torch.arange(8), module=True)
    assert torch.allclose(got, want)
    assert isinstance(InBatchNCE(0.1), ContrastiveLoss) and not list(InBatchNCE(0.1).state_dict())


def test_full_catalog_loss_module_scores_the_bank_with_the_batch_tools_re_encoded():
    """Its documents are the batch's gold tools (catalog rows; a random subset of ``grad_tools``); their
    fresh vectors replace their bank rows, with gradient, and tools not ``allowed`` or of another
    dataset (``groups``) are no negatives."""
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 4)
    catalog, x_q = torch.randn(10, 6), torch.randn(3, 6)
    gold = torch.tensor([[0, 4], [1, -1], [4, -1]])
    batch = {"gold": gold, "doc_tools": torch.tensor([0, 1, 4]), "positive": torch.tensor([0, 1, 2])}
    loss_fn = FullCatalogNCE(0.1, multi_positive=True)
    assert loss_fn.stale(0, 5)
    with torch.no_grad():
        loss_fn.refresh(model(catalog) * 0.5, step=0)  # a stale bank: not what the model gives now
    assert not loss_fn.stale(4, 5) and loss_fn.stale(5, 5)
    loss_fn.allowed = torch.tensor([True] * 9 + [False])
    loss_fn.groups = torch.tensor([0] * 8 + [1] * 2)
    assert loss_fn.documents(batch).tolist() == [0, 1, 4]
    stale = loss_fn.bank.clone()
    loss = loss_fn(lambda rows: model(x_q[rows]), lambda rows: model(catalog[rows]), batch)
    tools = stale.clone()
    tools[[0, 1, 4]] = model(catalog[[0, 1, 4]])
    allowed = torch.tensor([True] * 8 + [False] * 2)  # tool 9 not allowed, tools 8-9 of another dataset
    assert torch.allclose(loss, full_catalog_nce(model(x_q), tools, gold, 0.1, None, allowed))
    assert torch.allclose(loss_fn.bank[[0, 1, 4]], tools[[0, 1, 4]]) and torch.equal(loss_fn.bank[2], stale[2])
    loss.backward()
    assert model.weight.grad.abs().sum() > 0
    one = FullCatalogNCE(0.1, grad_tools=2)  # one positive each (the batch's columns), 2 of the 3 tools
    torch.manual_seed(1)
    rows = one.documents(batch)
    assert len(rows) == 2 and set(rows.tolist()) <= {0, 1, 4}
    with pytest.raises(RuntimeError, match="no bank"):
        one(lambda r: model(x_q[r]), lambda r: model(catalog[r]), batch)


def test_a_mixture_bank_is_refreshed_one_dataset_at_a_time():
    """With groups, a batch re-encodes only its own dataset's rows, when never encoded or ``every`` old on
    the step clock; the other datasets' rows are left as they are, and the loss equals one over a bank
    refreshed whole (other datasets' rows are masked out either way)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 4)
    catalog, x_q = torch.randn(10, 6), torch.randn(2, 6)
    groups = torch.tensor([0] * 6 + [1] * 4)
    gold0, gold1 = torch.tensor([[2, -1]]), torch.tensor([[7, -1], [9, -1]])
    batch = {"gold": gold1, "doc_tools": torch.tensor([7, 9]), "positive": torch.tensor([0, 1])}  # dataset 1
    loss_fn = FullCatalogNCE(0.1, multi_positive=True)
    loss_fn.groups = groups
    rows = loss_fn.due(gold1, step=0, every=5)
    assert rows.tolist() == [6, 7, 8, 9]  # nothing encoded yet: its own dataset's rows only
    with torch.no_grad():
        loss_fn.refresh(model(catalog[rows]), 0, rows)
    assert loss_fn.bank.shape == (10, 4) and (loss_fn.bank[:6] == 0).all()  # dataset 0: not encoded yet
    assert loss_fn.due(gold1, 4, 5) is None and loss_fn.due(gold1, 5, 5).tolist() == [6, 7, 8, 9]
    assert loss_fn.due(gold1, 9, 5) is None  # marked refreshed at step 5
    assert loss_fn.due(gold0, 9, 5).tolist() == list(range(6))  # dataset 0's first batch
    got = loss_fn(lambda r: model(x_q[r]), lambda r: model(catalog[r]), batch)
    whole = FullCatalogNCE(0.1, multi_positive=True)
    whole.groups = groups
    with torch.no_grad():
        whole.refresh(model(catalog), 0)
    assert whole.group_clock == {0: 0, 1: 0}
    want = whole(lambda r: model(x_q[r]), lambda r: model(catalog[r]), batch)
    assert torch.allclose(got, want)
    loss_fn.reset()
    assert loss_fn.bank is None and loss_fn.group_clock == {} == loss_fn.group_batches
    with pytest.raises(ValueError, match="per group"):
        FullCatalogNCE(0.1).refresh(model(catalog[:2]), 0, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="only a loss with groups"):
        FullCatalogNCE(0.1).due(gold0, 0, 5)


def test_refresh_by_dataset_batches_counts_each_datasets_own_batches():
    """``refresh_by: dataset_batches``: a dataset's rows are due every ``every`` of its own batches, however
    many optimizer steps the other datasets' batches took in between."""
    loss_fn = FullCatalogNCE(0.1, refresh_by="dataset_batches")
    loss_fn.groups = torch.tensor([0, 0, 1, 1])
    gold0, gold1 = torch.tensor([[0, -1]]), torch.tensor([[2, -1]])
    due = []
    for step in range(12):  # dataset 0 at every step but each third, which is dataset 1's
        gold = gold1 if step % 3 == 2 else gold0
        rows = loss_fn.due(gold, step, every=3)
        if rows is not None:
            loss_fn.refresh(torch.ones(len(rows), 4), step, rows)
            due.append((step, rows.tolist()))
    # dataset 0's batches 1, 4, 7 (steps 0, 4, 9); dataset 1's batches 1 and 4 (steps 2, 11)
    assert due == [(0, [0, 1]), (2, [2, 3]), (4, [0, 1]), (9, [0, 1]), (11, [2, 3])]
    with pytest.raises(ValueError, match="refresh_by"):
        FullCatalogNCE(0.1, refresh_by="epochs")
