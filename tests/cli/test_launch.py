"""``trainkit launch`` on torchrun, at -n 2 with gloo (real processes: ~20 s a group)."""

import argparse
import subprocess
import sys
import textwrap

import pytest

from multirank import process_env
from trainkit.cli._launch import torchrun_args

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    import torch.distributed as dist
    from trainkit.core.dist import init_distributed

    init_distributed(single_process=False)
    rank = dist.get_rank()
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    print(f"rank {rank} of {dist.get_world_size()} sum {total.item():.0f}", flush=True)
    dist.destroy_process_group()
    sys.exit(int(sys.argv[1]) if rank == 1 else 0)
    """
)


def launch(tmp_path, exit_code, **env):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    return subprocess.run(
        [sys.executable, "-m", "trainkit.cli", "launch", "-n", "2", str(script), str(exit_code)],
        capture_output=True,
        text=True,
        timeout=240,
        env=process_env(**env),
    )


def test_two_ranks_with_prefixed_output(tmp_path):
    result = launch(tmp_path, 0)
    assert result.returncode == 0, result.stderr
    out = result.stdout + result.stderr
    assert "[rank0]: rank 0 of 2 sum 3" in out
    assert "[rank1]: rank 1 of 2 sum 3" in out


def test_a_line_prefix_the_user_set_for_torchrun_wins(tmp_path):
    # The prefix goes through torchrun's environment variable (torch 2.11's torchrun has no
    # --log-line-prefix-template option): one the user exported is kept.
    result = launch(tmp_path, 0, TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="<${rank}> ")
    assert result.returncode == 0, result.stderr
    out = result.stdout + result.stderr
    assert "<1> rank 1 of 2 sum 3" in out and "[rank1]" not in out


def test_a_failing_rank_fails_the_launch(tmp_path):
    result = launch(tmp_path, 3)
    assert result.returncode == 1
    assert "rank 1 (exit 3) failed" in result.stderr


def ns(**kwargs):
    defaults = dict(
        nproc_per_node=2,
        nnodes=1,
        node_rank=0,
        master_addr=None,
        master_port=29500,
        max_restarts=0,
        log_dir=None,
        module=False,
        target="x.py",
        args=[],
    )
    return argparse.Namespace(**{**defaults, **kwargs})


def test_torchrun_command_lines():
    assert torchrun_args(ns())[-1] == "x.py" and "--standalone" in torchrun_args(ns())
    train = torchrun_args(ns(target="train", args=["c.yaml"]))
    assert train[-4:] == ["-m", "trainkit.cli", "train", "c.yaml"]
    multi = torchrun_args(
        ns(nnodes=2, node_rank=1, master_addr="10.0.0.1", module=True, target="pkg.main")
    )
    assert (
        "--master-addr=10.0.0.1" in multi
        and "--node-rank=1" in multi
        and multi[-2:] == ["-m", "pkg.main"]
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nnodes": 2}, "--nnodes > 1 needs --master-addr"),
        ({"nproc_per_node": 0}, "-n and --nnodes must be at least 1"),
        ({"nnodes": 2, "node_rank": 2, "master_addr": "h"}, r"--node-rank 2 is not in \[0, 2\)"),
    ],
)
def test_bad_launch_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        torchrun_args(ns(**kwargs))
