"""init_distributed: the process group from torchrun's environment, with a timeout."""

import time

import pytest
import torch
import torch.distributed as dist

from multirank import free_port, run_ranks
from parallel.helpers import max_difference, train
from trainkit.parallel import FSDP, init_distributed


def _torchrun_env(rank, world, port):
    dist.destroy_process_group()  # the harness's group; start again the torchrun way
    env = {
        "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    }  # fmt: skip
    started = init_distributed(env=env, timeout=30)
    again = init_distributed(env=env)
    total = torch.ones(1)
    dist.all_reduce(total)
    return started, again, dist.get_rank(), dist.get_world_size(), dist.get_backend(), total.item()


def test_joins_the_group_described_by_torchrun_variables():
    results = run_ranks(_torchrun_env, 2, free_port())
    assert results == [(True, False, 0, 2, "gloo", 2.0), (True, False, 1, 2, "gloo", 2.0)]


def _single_process(rank, world):
    dist.destroy_process_group()
    started = init_distributed(env={})
    weights = train(FSDP(), 0, 1)  # the same script, one process
    return started, dist.get_rank(), dist.get_world_size(), weights


def test_without_torchrun_starts_a_one_rank_group():
    started, rank, world, weights = run_ranks(_single_process, 1)[0]
    assert (started, rank, world) == (True, 0, 1)
    assert max_difference(weights, train(None, 0, 1)) < 1e-6


def _dead_peer(rank, world, port):
    dist.destroy_process_group()
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    init_distributed(env=env, timeout=1.0)
    if rank == 1:  # alive, but never joins the collective
        time.sleep(3)
        return None
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1))
    except RuntimeError:
        return time.monotonic() - start
    return "no error"


def test_a_rank_that_never_answers_fails_the_collective_after_the_timeout():
    waited = run_ranks(_dead_peer, 2, free_port())[0]
    assert isinstance(waited, float) and 0.5 < waited < 2.9


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
