"""``trainkit launch --ft-groups``: replica groups of a fault-tolerant run, each its own
torchrun with its own restarts."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from multirank import process_env
from trainkit.cli import _launch_ft
from trainkit.cli._launch import torchrun_args
from trainkit.cli._main import _parser

# No torch: each group's process records what it was given, then group 0 fails in its first
# life (its torchrun restarts it) and group 1 in every life (it has no restart left).
SCRIPT = textwrap.dedent(
    """
    import os, pathlib, sys
    group = os.environ["REPLICA_GROUP_ID"]
    life = os.environ["TORCHELASTIC_RESTART_COUNT"]
    folder = pathlib.Path(sys.argv[1])
    (folder / f"group{group}-life{life}").write_text(os.environ["TORCHFT_LIGHTHOUSE"])
    print(f"group {group} life {life}", flush=True)
    sys.exit(1 if group == "1" or life == "0" else 0)
    """
)


def parse(*argv: str):
    return _parser([]).parse_args(["launch", *argv])


def test_each_group_is_a_torchrun_with_its_number_and_the_lighthouse():
    args = parse(
        "--ft-groups", "2", "--lighthouse", "node0:29510", "-n", "1", "--max-restarts", "7",
        "train", "c.yaml", "--run-dir", "runs/x",
    )  # fmt: skip
    commands = _launch_ft.group_commands(args, torchrun_args)
    assert [env["REPLICA_GROUP_ID"] for env, _ in commands] == ["0", "1"]
    assert {env["TORCHFT_LIGHTHOUSE"] for env, _ in commands} == {"http://node0:29510"}
    for _, command in commands:
        assert command[1:3] == ["-m", "torch.distributed.run"]
        assert "--max-restarts=7" in command and "--standalone" in command
    train = ["-m", "trainkit.cli", "train", "c.yaml", "--run-dir", "runs/x"]
    # Group 0 writes the run (checkpoints included); the others beside it, no checkpoints.
    assert commands[0][1][-6:] == train
    assert commands[1][1][-10:] == [
        *train, "--run-dir", "runs/x/group1", "--set", "checkpoint=null",
    ]  # fmt: skip


def test_groups_of_a_later_node_are_numbered_from_its_first_group():
    args = parse("--ft-groups", "2", "--ft-first-group", "4", "-n", "1", "x.py")
    commands = _launch_ft.group_commands(args, torchrun_args)
    assert [env["REPLICA_GROUP_ID"] for env, _ in commands] == ["4", "5"]
    assert all(command[-1] == "x.py" for _, command in commands)  # a script: as given


def test_the_lighthouse_started_here_uses_the_port_and_quorum_size_given():
    args = parse(
        "--ft-groups", "3", "--lighthouse-port", "4321", "--ft-min-replicas", "2", "-n", "1", "x.py"
    )  # fmt: skip
    command = _launch_ft.lighthouse_command(args)
    assert command[0].endswith("torchft_lighthouse")
    assert command[1:] == ["--min_replicas=2", "--bind=[::]:4321"]
    envs = _launch_ft.group_commands(args, torchrun_args)
    assert envs[0][0]["TORCHFT_LIGHTHOUSE"].endswith(":4321")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ft-groups", "2", "--nnodes", "2", "--master-addr", "h"], "leave out --nnodes"),
        (["--ft-groups", "2", "--rdzv-endpoint", "h:29400"], "and --rdzv-endpoint"),
        (["--ft-groups", "-1"], "--ft-groups must be at least 1"),
        (["--ft-groups", "2", "-n", "1", "train", "c.yaml"], "train needs --run-dir DIR"),
    ],
)
def test_bad_group_options_are_refused(argv, message):
    args = parse(*argv) if "train" in argv else parse(*argv, "-n", "1", "x.py")
    with pytest.raises(ValueError, match=message):
        _launch_ft.group_commands(args, torchrun_args)


def test_a_group_is_restarted_by_its_own_torchrun_and_a_failed_one_fails_the_launch(tmp_path):
    script = tmp_path / "group.py"
    script.write_text(SCRIPT)
    result = subprocess.run(
        [
            sys.executable, "-m", "trainkit.cli", "launch", "--ft-groups", "2",
            "--lighthouse", "127.0.0.1:29510", "-n", "1", "--max-restarts", "1",
            str(script), str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=process_env(),
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "group 1 (exit 1) failed" in result.stderr
    assert "group 0 (exit" not in result.stderr
    lives = sorted(p.name for p in tmp_path.glob("group?-life?"))
    assert lives == ["group0-life0", "group0-life1", "group1-life0", "group1-life1"]
    assert (tmp_path / "group0-life1").read_text() == "http://127.0.0.1:29510"
    assert "[group0 rank0]: group 0 life 1" in out


class FakeGroup:
    """A group's torchrun that ends by itself after ``polls`` polls, or never (None)."""

    def __init__(self, polls: int | None, code: int = 0) -> None:
        self.polls, self.code, self.signals = polls, code, []

    def poll(self):
        if self.signals:
            return -15
        if self.polls is None:
            return None
        self.polls -= 1
        return self.code if self.polls < 0 else None

    def send_signal(self, signum):
        self.signals.append(signum)


def test_a_group_restarted_after_the_run_ended_is_stopped():
    done, late = FakeGroup(polls=1), FakeGroup(polls=None)
    assert _launch_ft.wait_for_groups([done, late], grace=0.0, poll=0.0) == [0, None]
    assert late.signals == [signal.SIGTERM]


def test_groups_are_waited_for_and_a_failure_is_reported():
    groups = [FakeGroup(polls=3), FakeGroup(polls=2, code=1)]
    assert _launch_ft.wait_for_groups(groups, grace=60.0, poll=0.0) == [0, 1]
    assert all(not g.signals for g in groups)
