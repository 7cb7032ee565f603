"""init_distributed under SLURM's srun without torchrun: one task per process, the group
described by SLURM's variables (no SLURM here: the variables are set by the test)."""

import os
import socket

import pytest
import torch
import torch.distributed as dist

from multirank import run_ranks
from trainkit.core.dist import _launcher_env, get_local_rank, get_sampler, init_distributed


def srun_env(procid=0, tasks=4, localid=0, **extra):
    """What srun sets in each task of a step (a subset), for job 123456."""
    return {
        "SLURM_JOB_ID": "123456",
        "SLURM_PROCID": str(procid),
        "SLURM_STEP_NUM_TASKS": str(tasks),
        "SLURM_NTASKS": str(tasks),
        "SLURM_LOCALID": str(localid),
        "SLURM_STEP_NODELIST": "gpu[007-009,12],cpu1",
        "SLURM_JOB_NODELIST": "gpu[007-009,12],cpu1,login2",
        **extra,
    }


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _srun_task(rank, world, port):
    dist.destroy_process_group()  # the harness's group; start again the srun way
    env = srun_env(rank, world, localid=rank, SLURM_STEP_NODELIST="localhost", MASTER_PORT=port)
    os.environ.update(env)  # get_local_rank and get_sampler read the process's environment
    sampler = get_sampler(list(range(10)))
    started = init_distributed(backend="gloo", timeout=60)
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    return (
        started,
        dist.get_rank(),
        dist.get_world_size(),
        get_local_rank(),
        total.item(),
        (
            sampler.rank,
            sampler.num_replicas,
        ),
    )


def test_srun_tasks_join_one_group_from_slurms_variables():
    port = str(_free_port())
    assert run_ranks(_srun_task, 2, port) == [
        (True, 0, 2, 0, 3.0, (0, 2)),
        (True, 1, 2, 1, 3.0, (1, 2)),
    ]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        # rank, world size, local rank, the step's first host, 10000 + job id % 20000
        (srun_env(3, 4, 1), (3, 4, 1, "gpu007", 13456)),
        (srun_env(0, 2, SLURM_STEP_NODELIST="node1,node2"), (0, 2, 0, "node1", 13456)),
        (srun_env(0, 2, SLURM_STEP_NODELIST="rack[2-3]-n[08-09]"), (0, 2, 0, "rack2-n08", 13456)),
        (srun_env(1, 2, SLURM_STEP_NODELIST=""), (1, 2, 0, "gpu007", 13456)),  # the job's list
        (srun_env(1, 2, MASTER_ADDR="10.0.0.5", MASTER_PORT="2345"), (1, 2, 0, "10.0.0.5", 2345)),
    ],
)
def test_the_group_srun_describes(env, expected):
    assert _launcher_env(env) == expected


def test_torchrun_wins_and_a_batch_script_is_not_a_launch():
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "9"}
    assert _launcher_env({**srun_env(), **torchrun}) == (1, 2, 0, "h", 9)  # torchrun in srun
    # A batch script's own process has SLURM_PROCID and SLURM_NTASKS but is no srun step:
    # it trains alone (starting a 4-rank group would wait for ranks that never come).
    batch = {k: v for k, v in srun_env().items() if not k.startswith("SLURM_STEP")}
    assert _launcher_env(batch) is None
    assert _launcher_env(srun_env(0, 1)) is None  # an srun step of one task
    assert init_distributed(env=batch, single_process=False) is False


def _without(*names):
    return {k: v for k, v in srun_env(1, 2).items() if k not in names}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (_without("SLURM_LOCALID"), r"an srun step of 2 tasks, but \['SLURM_LOCALID'\] are not set"),
        (
            _without("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"),
            r"\['SLURM_STEP_NODELIST or SLURM_JOB_NODELIST \(or MASTER_ADDR\)'\] are not set",
        ),
        (_without("SLURM_JOB_ID"), r"\['SLURM_JOB_ID \(or MASTER_PORT\)'\] are not set"),
        (srun_env(1, 2, SLURM_LOCALID="one"), "SLURM_PROCID, SLURM_LOCALID, SLURM_JOB_ID and "
         r"MASTER_PORT must be integers, got \['1', 'one', '123456', None\]"),
        (srun_env(2, 2), r"SLURM_PROCID=2 is outside 0..1 \(the step's tasks\)"),
        (srun_env(1, "two"), "SLURM_STEP_NUM_TASKS must be an integer, got 'two'"),
        (srun_env(1, 2, SLURM_STEP_NODELIST="gpu[1-2"), "SLURM node list 'gpu.1-2' is not a host list"),
    ],
)  # fmt: skip
def test_an_incomplete_srun_environment_is_a_clear_error(env, message):
    with pytest.raises(ValueError, match=message):
        init_distributed(env=env)
    assert not dist.is_initialized()
