"""`trainkit.core.dist` with and without a process group, and metrics synced over ranks."""

import pytest
import torch

from multirank import run_ranks
from trainkit.core import dist
from trainkit.trainer.metrics import Accuracy, CrossEntropy, Mean

# --- no process group ---------------------------------------------------------------------


def test_without_a_process_group_there_is_one_rank():
    assert not dist.is_initialized()
    assert dist.get_rank() == 0
    assert dist.get_world_size() == 1
    assert dist.get_local_rank() == 0
    dist.barrier()  # returns at once


def test_without_a_process_group_collectives_are_identities():
    payload = {"seed": 3}
    assert dist.broadcast_object(payload) is payload
    assert dist.all_gather_object(payload) == [payload]
    assert dist.all_gather_object(payload)[0] is payload
    tensor = torch.tensor([1.0, 2.0])
    assert dist.all_reduce(tensor) is tensor
    assert dist.all_reduce(tensor, "max").tolist() == [1.0, 2.0]
    assert dist.any_rank(True) is True
    assert dist.any_rank(False) is False


def test_all_reduce_rejects_an_unknown_op_even_on_one_rank():
    with pytest.raises(
        ValueError,
        match=r"all_reduce op 'mean' is not supported; use one of \['max', 'min', 'sum'\]",
    ):
        dist.all_reduce(torch.ones(1), "mean")


# --- several ranks ------------------------------------------------------------------------


def collectives(rank, world_size):
    summed = dist.all_reduce(torch.tensor([float(rank), 1.0]), "sum")
    largest = dist.all_reduce(torch.tensor([rank * 10], dtype=torch.int64), "max")
    smallest = dist.all_reduce(torch.tensor([rank + 5.0]), "min")
    dist.barrier()
    return {
        "initialized": dist.is_initialized(),
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "broadcast": dist.broadcast_object({"from": rank, "items": [rank] * 2}),
        "broadcast_last": dist.broadcast_object(f"rank-{rank}", src=world_size - 1),
        "gathered": dist.all_gather_object(("r", rank)),
        "sum": summed.tolist(),
        "max": largest.item(),
        "min": smallest.item(),
        "any_last": dist.any_rank(rank == world_size - 1),
        "any_none": dist.any_rank(False),
        "any_all": dist.any_rank(True),
    }


@pytest.mark.parametrize("world_size", [2, 4])
def test_collectives_on_several_ranks(world_size):
    results = run_ranks(collectives, world_size)
    ranks = range(world_size)
    assert [r["rank"] for r in results] == list(ranks)
    for result in results:
        assert result["initialized"]
        assert result["world_size"] == world_size
        assert result["broadcast"] == {"from": 0, "items": [0, 0]}
        assert result["broadcast_last"] == f"rank-{world_size - 1}"
        assert result["gathered"] == [("r", r) for r in ranks]
        assert result["sum"] == [float(sum(ranks)), float(world_size)]
        assert result["max"] == 10 * (world_size - 1)
        assert result["min"] == 5.0
        assert result["any_last"] is True
        assert result["any_none"] is False
        assert result["any_all"] is True


def metric_data():
    """13 samples (uneven across ranks), 4 classes, some targets ignored."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(13, 4, generator=generator)
    target = torch.randint(0, 4, (13,), generator=generator)
    ignored = target.clone()
    ignored[[1, 6, 11]] = -100
    values = torch.randn(13, generator=generator)
    return logits, target, ignored, values


def compute_metrics(rank, world_size):
    logits, target, ignored, values = metric_data()
    shard = slice(rank, None, world_size)
    accuracy, cross_entropy, mean = Accuracy(), CrossEntropy(), Mean()
    # Two updates per rank, so the running sums matter, not only the last batch.
    for part in (slice(0, 2), slice(2, None)):
        accuracy.update(logits[shard][part], target[shard][part])
        cross_entropy.update(logits[shard][part], ignored[shard][part])
        mean.update(values[shard][part])
    only_rank0 = Mean()
    if rank == 0:
        only_rank0.update(values)
    return {
        "accuracy": accuracy.compute().item(),
        "cross_entropy": cross_entropy.compute().item(),
        "mean": mean.compute().item(),
        "mean_of_rank0_data": only_rank0.compute().item(),
    }


def test_metrics_on_two_ranks_equal_the_single_process_value_on_all_the_data():
    logits, target, ignored, values = metric_data()
    accuracy, cross_entropy, mean = Accuracy(), CrossEntropy(), Mean()
    accuracy.update(logits, target)
    cross_entropy.update(logits, ignored)
    mean.update(values)
    expected = {
        "accuracy": accuracy.compute().item(),
        "cross_entropy": cross_entropy.compute().item(),
        "mean": mean.compute().item(),
    }
    # the single-process values are the plain definitions over the union
    assert expected["accuracy"] == pytest.approx(
        (logits.argmax(-1) == target).float().mean().item()
    )
    assert expected["cross_entropy"] == pytest.approx(
        torch.nn.functional.cross_entropy(logits, ignored, ignore_index=-100).item()
    )
    assert expected["mean"] == pytest.approx(values.mean().item())

    results = run_ranks(compute_metrics, 2)
    for result in results:
        # a rank that saw no data still gets the value over the other ranks' data
        assert result["mean_of_rank0_data"] == pytest.approx(expected["mean"], rel=1e-6)
        for name, value in expected.items():
            assert result[name] == pytest.approx(value, rel=1e-6), name
