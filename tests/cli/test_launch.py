"""``trainkit launch`` on torchrun, at -n 2 with gloo (real processes: ~20 s a group)."""

import subprocess
import sys
import textwrap

import pytest

from multirank import process_env
from trainkit.cli._launch import torchrun_args
from trainkit.cli._main import _parser, main

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


def command(*argv):
    """torchrun's command line for ``trainkit launch ARGV x.py``, through the real parser."""
    return torchrun_args(_parser([]).parse_args(["launch", *argv, "x.py"]))


def test_torchrun_command_lines():
    single = command("-n", "2")
    assert single[-1] == "x.py" and "--standalone" in single
    train = torchrun_args(_parser([]).parse_args(["launch", "-n", "2", "train", "c.yaml"]))
    assert train[-4:] == ["-m", "trainkit.cli", "train", "c.yaml"]
    static = command("-n", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1")
    assert {"--nnodes=2", "--node-rank=1", "--master-addr=10.0.0.1", "--master-port=29500"} <= set(
        static
    )
    assert not any(arg.startswith("--rdzv") for arg in static)


def test_elastic_command_lines_use_the_c10d_rendezvous():
    elastic = command(
        "-n", "8", "--nnodes", "1:4", "--rdzv-endpoint", "node0:29400", "--rdzv-id", "job7",
        "--rdzv-conf", "last_call_timeout=5, join_timeout=900", "--max-restarts", "3",
    )  # fmt: skip
    assert elastic[:7] == [
        "--nproc-per-node=8",
        "--nnodes=1:4",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=node0:29400",
        "--rdzv-id=job7",
        "--rdzv-conf=last_call_timeout=5,join_timeout=900",
        "--max-restarts=3",
    ]
    assert "--master-addr" not in " ".join(elastic) and "--standalone" not in elastic
    # A fixed count through c10d, torchrun's default port, and IPv6 in brackets.
    assert "--nnodes=2:2" in command("-n", "1", "--nnodes", "2", "--rdzv-endpoint", "h")
    assert "--rdzv-endpoint=h:29400" in command("-n", "1", "--nnodes", "2", "--rdzv-endpoint", "h")
    assert "--rdzv-endpoint=[fd00::1]:80" in command("-n", "1", "--rdzv-endpoint", "[fd00::1]:80")
    # One node with c10d asked for: torchrun's standalone c10d store on a free port.
    assert {"--rdzv-backend=c10d", "--standalone"} <= set(
        command("-n", "2", "--rdzv-backend", "c10d")
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nnodes", "2"], "--nnodes 2 needs --rdzv-endpoint HOST:PORT .* or --master-addr"),
        (["-n", "0"], "-n must be at least 1, got 0"),
        (["--max-restarts", "-1"], "--max-restarts must be 0 or more, got -1"),
        (["--nnodes", "2", "--node-rank", "2", "--master-addr", "h"], r"--node-rank 2 is not in \[0, 2\)"),
        (["--nnodes", "4:2", "--rdzv-endpoint", "h:1"], "--nnodes '4:2': MIN 4 is larger than MAX 2"),
        (["--nnodes", "0:2", "--rdzv-endpoint", "h:1"], "--nnodes '0:2' is not a node count; give N or MIN:MAX"),
        (["--nnodes", "two"], "--nnodes 'two' is not a node count"),
        (["--nnodes", "1:2:3"], "--nnodes '1:2:3' is not a node count"),
        (["--nnodes", "1:4"], "--nnodes 1:4 is a range: an elastic job needs the c10d rendezvous; add --rdzv-endpoint"),
        (["--nnodes", "1:4", "--master-addr", "h"], "--nnodes 1:4 is a range"),
        (["--nnodes", "2", "--rdzv-backend", "c10d"], "--nnodes 2 with the c10d rendezvous needs --rdzv-endpoint"),
        (["--rdzv-endpoint", "h:1", "--master-addr", "h"], "--master-addr cannot be combined with the c10d rendezvous"),
        (["--rdzv-endpoint", "h:1", "--node-rank", "1", "--master-port", "5"], "--master-port and --node-rank cannot be combined"),
        (["--rdzv-endpoint", "h:1", "--rdzv-backend", "static"], "--rdzv-backend static cannot be combined"),
        (["--rdzv-endpoint", "h:port"], "--rdzv-endpoint 'h:port' is not HOST:PORT"),
        (["--rdzv-endpoint", ":29400"], "--rdzv-endpoint ':29400' is not HOST:PORT"),
        (["--rdzv-endpoint", "h:70000"], "--rdzv-endpoint 'h:70000' is not HOST:PORT"),
        (["--rdzv-endpoint", "h", "--rdzv-conf", "last_call=5"], "--rdzv-conf: unknown setting 'last_call'; the c10d rendezvous reads join_timeout, last_call_timeout"),
        (["--rdzv-endpoint", "h", "--rdzv-conf", "join_timeout"], "--rdzv-conf 'join_timeout' is not KEY=VALUE"),
        (["--rdzv-id", "job7"], "--rdzv-id: options of the c10d rendezvous at --rdzv-endpoint"),
        (["--nnodes", "2", "--master-addr", "h", "--rdzv-conf", "is_host=1"], "--rdzv-conf: options of the c10d"),
        (["--rdzv-backend", "c10d", "--rdzv-id", "job7"], "--rdzv-id: options of the c10d"),
    ],
)  # fmt: skip
def test_bad_launch_arguments(argv, message):
    with pytest.raises(ValueError, match=message):
        command(*(argv if "-n" in argv else ["-n", "2", *argv]))


def test_bad_arguments_are_reported_on_the_command_line(capsys):
    assert main(["launch", "-n", "2", "--nnodes", "1:4", "x.py"]) == 2
    assert "trainkit launch: --nnodes 1:4 is a range" in capsys.readouterr().err
