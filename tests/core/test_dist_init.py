"""init_distributed: the process group from torchrun's environment, with a timeout.

(FSDP trained in the one-rank group it starts is tested in tests/parallel/test_fsdp.py.)
"""

import datetime

import pytest
import torch
import torch.distributed as dist

from multirank import fork_context, run_ranks, torchrun_env
from trainkit.core.dist import init_distributed


def _torchrun_env(rank, world):
    dist.destroy_process_group()  # the harness's group; start again the torchrun way
    env = torchrun_env(rank, world)
    # single_process=False starts nothing alone, but still joins a torchrun job.
    started = init_distributed(env=env, timeout=30, single_process=False)
    again = init_distributed(env=env)
    total = torch.ones(1)
    dist.all_reduce(total)
    return started, again, dist.get_rank(), dist.get_world_size(), dist.get_backend(), total.item()


def test_joins_the_group_described_by_torchrun_variables():
    results = run_ranks(_torchrun_env, 2)
    assert results == [(True, False, 0, 2, "gloo", 2.0), (True, False, 1, 2, "gloo", 2.0)]


def _single_process(rank, world):
    dist.destroy_process_group()
    started = init_distributed(env={})
    total = torch.full((1,), 3.0)
    dist.all_reduce(total)
    return started, dist.get_rank(), dist.get_world_size(), total.item()


def test_without_torchrun_starts_a_one_rank_group():
    assert run_ranks(_single_process, 1) == [(True, 0, 1, 3.0)]


def test_without_torchrun_and_single_process_false_starts_nothing():
    assert init_distributed(env={}, single_process=False) is False
    assert not dist.is_initialized()


def _dead_peer(rank, world, peer_joining, rank0_done):
    dist.destroy_process_group()
    env = torchrun_env(rank, world)
    if rank == 1:  # alive and in the group, but silent until rank 0 has given up
        peer_joining.set()
        init_distributed(env=env, timeout=60.0)
        rank0_done.wait(60)
        return None
    try:
        # The 1 s also bounds the rendezvous: join once the peer is joining, so that a rank
        # scheduled late on busy cores cannot fail init_distributed itself.
        peer_joining.wait(60)
        init_distributed(env=env, timeout=1.0)
        timeout = dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout
        try:
            dist.all_reduce(torch.ones(1))
        except RuntimeError as err:
            return timeout, str(err)
        return timeout, "no error"
    finally:
        rank0_done.set()


def test_a_rank_that_never_answers_fails_the_collective_after_the_timeout():
    # No wall-clock bounds (shared cores): rank 1 stays alive, silent, until rank 0's
    # collective has failed, so only rank 0's timeout can end it; the group carries the
    # 1 s given to init_distributed, and the error names it.
    peer_joining, rank0_done = fork_context().Event(), fork_context().Event()
    (timeout, error), _ = run_ranks(_dead_peer, 2, peer_joining, rank0_done)
    assert timeout == datetime.timedelta(seconds=1)
    assert error != "no error"
    assert "1000ms" in error, error


def test_nccl_without_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="backend 'nccl' needs CUDA GPUs, and none is available"):
        init_distributed(backend="nccl", env={})


def test_bad_arguments_and_environments():
    with pytest.raises(ValueError, match=r"backend 'mpi' is not supported; use one of \['auto'"):
        init_distributed(backend="mpi", env={})
    with pytest.raises(ValueError, match=r"timeout must be positive, got 0\.0 s"):
        init_distributed(timeout=0, env={})
    with pytest.raises(ValueError, match="timeout '10s' is not a duration"):
        init_distributed(timeout="10s", env={})
    with pytest.raises(ValueError, match=r"incomplete torchrun environment: \['RANK'\] are set"):
        init_distributed(env={"RANK": "0"})
    env = {"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    with pytest.raises(ValueError, match=r"RANK=2 is outside 0..WORLD_SIZE-1 \(WORLD_SIZE=2\)"):
        init_distributed(env=env)
    with pytest.raises(ValueError, match="torchrun variables must be integers"):
        init_distributed(env={**env, "RANK": "zero"})
    assert not dist.is_initialized()
