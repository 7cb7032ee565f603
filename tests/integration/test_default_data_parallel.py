"""At world size > 1 with no ``parallelism=``, the Trainer trains one model with DDP.

Integration: the default strategy comes from trainkit-parallel, found through its entry
point. Each rank starts from a different initialisation and reads different data, so only
data parallelism (rank 0's weights broadcast, gradients averaged) keeps the replicas equal.
"""

import os
import time

import pytest
import torch
import torch.distributed

from multirank import run_ranks, torchrun_env
from toy import blobs, flat_params, loader, mlp
from trainkit.core import Callback, SingleProcess, dist
from trainkit.parallel import DDP
from trainkit.trainer import Trainer
from trainkit.trainer.schedulers import LinearWithWarmupScheduler


def _trainer(rank, max_duration="3ba", **kwargs):
    return Trainer(
        model=mlp(seed=rank),  # different weights on each rank before the Trainer
        train_dataloader=loader(blobs(64, seed=rank)),  # different data on each rank
        max_duration=max_duration,
        device="cpu",
        progress_bar=False,
        seed=7,
        **kwargs,
    )


def _weights_on_every_rank(trainer):
    state = trainer.state
    return dist.all_gather_object(flat_params(state.parallelism.unwrap(state.model)))


def _default_under_torchrun(rank, world):
    # Start as a torchrun worker does: no process group, only the launcher's variables.
    torch.distributed.destroy_process_group()
    os.environ.update(torchrun_env(rank, world))
    assert not dist.is_initialized()
    trainer = _trainer(rank)  # no parallelism=
    started = dist.is_initialized() and dist.get_world_size() == world
    is_ddp = isinstance(trainer.state.parallelism, DDP)
    trainer.fit()
    return started, is_ddp, trainer.state.seed, _weights_on_every_rank(trainer)


def test_two_ranks_without_a_strategy_train_one_model_with_ddp():
    results = run_ranks(_default_under_torchrun, 2)
    for started, is_ddp, seed, (rank0, rank1) in results:
        assert started, "the Trainer did not start the process group from torchrun's variables"
        assert is_ddp
        assert seed == 7
        assert torch.equal(rank0, rank1), (rank0 - rank1).abs().max()
    # Training moved the weights (from rank 0's initialisation, which DDP broadcast).
    assert not torch.equal(results[0][3][0], flat_params(mlp(seed=0)))


def _explicit_single_process(rank, world):
    with pytest.warns(RuntimeWarning, match="each rank trains its own replica"):
        trainer = _trainer(rank, parallelism=SingleProcess())
    trainer.fit()
    rank0, rank1 = _weights_on_every_rank(trainer)
    return type(trainer.state.parallelism).__name__, (rank0 - rank1).abs().max().item()


def test_explicit_single_process_at_two_ranks_warns_and_trains_independent_replicas():
    for name, difference in run_ranks(_explicit_single_process, 2):
        assert name == "SingleProcess"
        assert difference > 1e-3


class _Clock(Callback):
    """A fake ``time.perf_counter`` that stands still except at batch starts: a batch takes
    ``seconds`` on this rank."""

    def __init__(self, seconds):
        self.now, self.seconds = 1000.0, seconds
        time.perf_counter = lambda: self.now  # in the forked rank only

    def batch_start(self, state, logger):
        self.now += self.seconds


def _wall_clock_budget(rank, world):
    # Rank 1 is slower: by its own clock rank 0 would stop after batch 5 (5 s), rank 1 after
    # batch 4 (6 s), leaving rank 0 in a collective alone and the two replicas with
    # different learning rates.
    trainer = _trainer(
        rank,
        parallelism=DDP(),
        max_duration="5sec",
        schedulers=LinearWithWarmupScheduler(t_warmup="0.2dur"),  # LR follows the clock
        callbacks=[_Clock(1.0 if rank == 0 else 1.5)],
    )
    trainer.fit()
    rank0, rank1 = _weights_on_every_rank(trainer)
    state = trainer.state
    return state.timestamp.batch, state.timestamp.total_wct, (rank0 - rank1).abs().max().item()


def test_a_wall_clock_budget_stops_every_rank_after_the_same_batch():
    for batches, seconds, difference in run_ranks(_wall_clock_budget, 2):
        assert batches == 4  # the slowest rank's clock: 4 x 1.5 s crosses 5 s
        assert seconds == 6.0
        assert difference == 0.0
