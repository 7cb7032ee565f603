"""The Trainer on 2 gloo ranks (forked): eval metrics, auto-microbatching and seeds agree."""

import torch
from torch.utils.data import DataLoader, DistributedSampler

from multirank import run_ranks
from toy import EvalOOM, OOMAbove, blobs, loader, mlp
from trainkit.core import Evaluator, SingleProcess
from trainkit.trainer import Trainer


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


class _WholeBatches(torch.utils.data.Dataset):
    """Five batches of 20 samples, each index a whole batch (for ``batch_size=None``)."""

    def __init__(self, data):
        self.x, self.y = data.tensors

    def __len__(self):
        return 5

    def __getitem__(self, index):
        return self.x[index * 20 : (index + 1) * 20], self.y[index * 20 : (index + 1) * 20]


def _eval_with_repeats(rank, world_size):
    # 101 samples do not divide among 2 or 4 ranks: a DistributedSampler without drop_last
    # repeats 1 (or 3) of them so that every rank gets as many.
    data = blobs(101, seed=5)
    loaders = {
        "batches of 16": DataLoader(data, batch_size=16, sampler=DistributedSampler(data)),
        "batches of 1": DataLoader(data, batch_size=1, sampler=DistributedSampler(data)),
        # 51 samples a rank (2 ranks): 3 full batches of 17, the repeat in the last one.
        "drop_last, 17": DataLoader(
            data, batch_size=17, drop_last=True, sampler=DistributedSampler(data)
        ),
        "whole batches": DataLoader(
            _WholeBatches(blobs(100, seed=5)),
            batch_size=None,
            sampler=DistributedSampler(range(5), shuffle=False),
        ),
    }
    # Microbatches of 1: rank 1's last one is only the repeat, still run (a sharded model
    # needs every rank in every forward) and not counted.
    loaders["microbatches of 1"] = Evaluator(
        label="eval",
        data=DataLoader(data, batch_size=16, sampler=DistributedSampler(data)),
        device_eval_microbatch_size=1,
    )
    # Rank 1 runs out of memory above 4 samples, rank 0 never: both halve together.
    loaders["auto"] = Evaluator(
        label="eval",
        data=DataLoader(data, batch_size=16, sampler=DistributedSampler(data)),
        device_eval_microbatch_size="auto",
    )
    results = {}
    for name, eval_loader in loaders.items():
        model = EvalOOM(limit=4 if rank == 1 and name == "auto" else 1000)
        trainer = _trainer(model, rank, seed=3)
        metrics = trainer.eval(eval_loader)
        accuracy = trainer.state.eval_metrics["eval"]["accuracy"]
        results[name] = (
            float(metrics["metrics/eval/cross_entropy"]),
            int(accuracy.count),
            list(model.sizes),
            int(trainer.state.eval_timestamp.sample),  # this rank's, repeats not counted
        )
    return results


def test_eval_counts_each_sample_once_when_a_distributed_sampler_repeats_some():
    single = _trainer(EvalOOM(), 0, seed=3)
    expected = float(single.eval(loader(blobs(101, seed=5)))["metrics/eval/cross_entropy"])
    expected_100 = float(single.eval(loader(blobs(100, seed=5)))["metrics/eval/cross_entropy"])
    for world_size in (2, 4):
        results = run_ranks(_eval_with_repeats, world_size)
        counts = {name: sum(r[name][1] for r in results) for name in results[0]}
        assert counts == {name: sum(r[name][3] for r in results) for name in results[0]}
        assert counts["batches of 16"] == counts["batches of 1"] == 101
        for name in ("batches of 16", "batches of 1"):
            for result in results:
                assert abs(result[name][0] - expected) < 1e-5, (world_size, name)
        # Whole batches: 5 among the ranks, the repeated ones not counted.
        assert counts["whole batches"] == 100
        assert all(abs(r["whole batches"][0] - expected_100) < 1e-5 for r in results)
        if world_size == 2:
            assert counts["drop_last, 17"] == 101
            assert all(abs(r["drop_last, 17"][0] - expected) < 1e-5 for r in results)
        else:  # 26 a rank: one batch of 17, the rest (with the repeats) dropped
            assert counts["drop_last, 17"] == 4 * 17
        # Every rank runs as many forwards, the repeats uncounted.
        per_sample = [r["microbatches of 1"][2] for r in results]
        assert all(sizes == per_sample[0] for sizes in per_sample)
        assert counts["microbatches of 1"] == 101
        # Out of memory on rank 1 only: every rank halved to 4 and retried the batch.
        # (Rank 0 finishes each attempt: 16, then 8 and 8, then 4s from the first batch on.)
        assert results[1]["auto"][2][:3] == [16, 8, 4]
        assert results[0]["auto"][2][:5] == [16, 8, 8, 4, 4]
        assert all(max(r["auto"][2][3:]) == 4 for r in results)
        assert counts["auto"] == 101
        for name in ("microbatches of 1", "auto"):
            assert all(abs(r[name][0] - expected) < 1e-5 for r in results), (world_size, name)
