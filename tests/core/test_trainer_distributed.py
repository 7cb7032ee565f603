"""The Trainer on 2 gloo ranks (forked): eval metrics, auto-microbatching and seeds agree."""

import torch
from torch.utils.data import DataLoader, DistributedSampler

from multirank import run_ranks
from toy import OOMAbove, blobs, loader, mlp
from trainkit.core import SingleProcess, Trainer


def _trainer(model, rank, **kwargs):
    return Trainer(
        model=model,
        train_dataloader=loader(blobs(64)),
        max_duration="2ba",
        progress_bar=False,
        device="cpu",
        # Each rank its own replica, on purpose: these checks need no DDP (and core's tests
        # run without trainkit-parallel).
        parallelism=SingleProcess(),
        **kwargs,
    )


def _distributed_checks(rank, world_size):
    data = blobs(100, seed=5)  # 100 samples: 50 per rank
    eval_loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data, shuffle=False))
    metrics = _trainer(mlp(seed=0), rank, eval_dataloader=eval_loader, seed=3).eval()

    # Rank 1 runs out of memory above 4 samples, rank 0 never: both must halve together.
    model = OOMAbove(limit=4 if rank == 1 else 1000)
    trainer = _trainer(model, rank, device_train_microbatch_size="auto", seed=3)
    trainer.fit()

    unseeded = _trainer(mlp(), rank)
    return {
        "accuracy": float(metrics["metrics/eval/accuracy"]),
        "cross_entropy": float(metrics["metrics/eval/cross_entropy"]),
        "microbatch": trainer.state.device_train_microbatch_size,
        "sizes": model.sizes[:4],
        "seed": unseeded.state.seed,
        "draw": torch.rand(1).item(),
    }


def test_two_ranks_agree():
    results = run_ranks(_distributed_checks, 2)
    single = _trainer(
        mlp(seed=0), 0, eval_dataloader=loader(blobs(100, seed=5), shuffle=False), seed=3
    ).eval()
    for result in results:
        assert abs(result["accuracy"] - float(single["metrics/eval/accuracy"])) < 1e-6
        assert abs(result["cross_entropy"] - float(single["metrics/eval/cross_entropy"])) < 1e-5
        assert result["microbatch"] == 4
    # Rank 0 fits each size but retries whenever rank 1 reports out-of-memory.
    assert results[0]["sizes"] == [16, 8, 8, 4]
    assert results[1]["sizes"] == [16, 8, 4, 4]
    assert results[0]["seed"] == results[1]["seed"]  # one run seed, broadcast from rank 0
    assert results[0]["draw"] != results[1]["draw"]  # rank r is seeded with seed + r
