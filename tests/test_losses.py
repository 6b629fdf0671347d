"""Contrastive loss pieces, without a model; and the cross-rank gather against one big batch."""

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from toolgraph.nn.losses import false_negative_mask, gather_no_grad, gather_with_grad, info_nce


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


def _loss(model, x_q, x_d, gold, doc_tools, positive, offset=0, gather=False):
    q = F.normalize(model(x_q), dim=1)
    d = F.normalize(model(x_d), dim=1)
    if gather:
        d, doc_tools = gather_with_grad(d), gather_no_grad(doc_tools)
        positive = positive + offset
    return info_nce(q, d, positive, 0.1, false_negative_mask(gold, doc_tools, positive))


def _worker(rank: int, world: int, port: int, out_path: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    model, x_q, x_d, gold, doc_tools = _model_and_data()
    b = 8 // world
    sl = slice(rank * b, (rank + 1) * b)
    loss = _loss(model, x_q[sl], x_d[sl], gold[sl], doc_tools[sl], torch.arange(b), offset=rank * b, gather=True)
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
def test_two_ranks_of_batch_b_equal_one_process_of_batch_2b(tmp_path):
    model, x_q, x_d, gold, doc_tools = _model_and_data()
    loss = _loss(model, x_q, x_d, gold, doc_tools, torch.arange(8))
    loss.backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]

    out_path = str(tmp_path / "rank0.pt")
    mp.spawn(_worker, args=(2, _free_port(), out_path), nprocs=2, join=True)
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
