"""``trainkit launch --ft-groups N``: replica groups of a fault-tolerant run (torchft).

Each replica group is its own torchrun (``torch.distributed.run --standalone``, with its
own ``--max-restarts``), so a group that dies is restarted by its agent while the other
groups train on; the groups find each other through torchft's lighthouse, which this
command starts here (``torchft_lighthouse``) unless ``--lighthouse`` names a running one.
Each group gets ``REPLICA_GROUP_ID`` and ``TORCHFT_LIGHTHOUSE`` in its environment, which
the ``fault_tolerant`` strategy reads (docs/fault_tolerance.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["add_ft_options", "group_commands", "lighthouse_command", "run_groups"]

PREFIX_VARIABLE = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
LIGHTHOUSE_PORT = 29510
"""torchft's default lighthouse port."""


def add_ft_options(parser: argparse.ArgumentParser) -> None:
    """The fault-tolerance options of ``trainkit launch``."""
    group = parser.add_argument_group(
        "fault tolerance (torchft)",
        "run --ft-groups replica groups, each its own torchrun of -n processes, that "
        "train together through torchft's lighthouse; a group that dies is restarted "
        "(--max-restarts) and recovers from the others while they go on",
    )
    group.add_argument(
        "--ft-groups", type=int, default=0, help="replica groups to run on this node"
    )
    group.add_argument(
        "--ft-first-group",
        type=int,
        default=0,
        help="number of this node's first group (groups are numbered across nodes)",
    )
    group.add_argument(
        "--lighthouse",
        metavar="HOST:PORT",
        help="a running torchft lighthouse (default: start one on this node)",
    )
    group.add_argument(
        "--lighthouse-port",
        type=int,
        default=LIGHTHOUSE_PORT,
        help=f"port of the lighthouse started here (default {LIGHTHOUSE_PORT})",
    )
    group.add_argument(
        "--ft-min-replicas",
        type=int,
        default=1,
        help="groups the lighthouse started here waits for before the first quorum",
    )


def lighthouse_command(args: argparse.Namespace) -> list[str]:
    """The ``torchft_lighthouse`` command line for the lighthouse this node starts."""
    name = "torchft_lighthouse"
    binary = shutil.which(name) or _beside_python(name) or name
    return [
        binary,
        f"--min_replicas={args.ft_min_replicas}",
        f"--bind=[::]:{args.lighthouse_port}",
    ]


def group_commands(
    args: argparse.Namespace, torchrun_args: Callable[[argparse.Namespace], list[str]]
) -> list[tuple[dict[str, str], list[str]]]:
    """For each of this node's groups: its extra environment and its torchrun command."""
    if args.ft_groups < 1 or args.ft_first_group < 0:
        raise ValueError(
            f"--ft-groups must be at least 1 and --ft-first-group at least 0, got "
            f"{args.ft_groups} and {args.ft_first_group}"
        )
    if str(args.nnodes) != "1" or args.master_addr or args.rdzv_endpoint:
        raise ValueError(
            "--ft-groups runs each replica group on this node with its own torchrun: leave "
            "out --nnodes, --master-addr and --rdzv-endpoint; start `trainkit launch "
            "--ft-groups` on every node with its own --ft-first-group and one --lighthouse"
        )
    if args.lighthouse:
        address = args.lighthouse
        if not address.startswith(("http://", "https://")):
            address = f"http://{address}"
    else:
        address = f"http://{_hostname()}:{args.lighthouse_port}"
    torchrun = [sys.executable, "-m", "torch.distributed.run", *torchrun_args(args)]
    run_dir = _run_dir(args)
    commands = []
    for number in range(args.ft_first_group, args.ft_first_group + args.ft_groups):
        env = {
            "REPLICA_GROUP_ID": str(number),
            "TORCHFT_LIGHTHOUSE": address,
            # Each line a rank prints names its group and rank (a user's template wins).
            PREFIX_VARIABLE: os.environ.get(PREFIX_VARIABLE, f"[group{number} rank${{rank}}]: "),
        }
        command = torchrun
        if run_dir is not None and number > 0:
            # The groups hold the same state: group 0 writes the run's checkpoints; the
            # others keep their own outputs (metrics) beside it, and no checkpoints.
            extra = [
                "--run-dir",
                os.path.join(run_dir, f"group{number}"),
                "--set",
                "checkpoint=null",
            ]
            command = [*torchrun, *extra]
        commands.append((env, command))
    return commands


def _run_dir(args: argparse.Namespace) -> str | None:
    """``train``'s ``--run-dir``, required with several groups (None: not ``train``)."""
    if args.target != "train" or args.module:
        return None
    found = None
    for i, arg in enumerate(args.args):
        if arg == "--run-dir" and i + 1 < len(args.args):
            found = args.args[i + 1]
        elif arg.startswith("--run-dir="):
            found = arg.partition("=")[2]
    if found is None:
        raise ValueError(
            "trainkit launch --ft-groups ... train needs --run-dir DIR after the config: group "
            "0 writes the run (its checkpoints) there, group N into DIR/groupN"
        )
    return found


def run_groups(
    args: argparse.Namespace, torchrun_args: Callable[[argparse.Namespace], list[str]]
) -> int:
    """Start the lighthouse (unless given) and every group; wait for the groups to end.

    0 when every group ended well, 1 when one failed (after its restarts); SIGTERM or
    SIGINT is passed on to every group.
    """
    commands = group_commands(args, torchrun_args)
    lighthouse = None
    if not args.lighthouse:
        try:
            lighthouse = subprocess.Popen(lighthouse_command(args))
        except FileNotFoundError as error:
            raise ValueError(
                "--ft-groups needs torchft's lighthouse (torchft_lighthouse), which is not "
                'installed: pip install "trainkit-parallel[ft]"; or pass --lighthouse '
                "HOST:PORT"
            ) from error
    groups: list[subprocess.Popen[bytes]] = []
    forward = _forwarding(groups)
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for extra, command in commands:
            groups.append(subprocess.Popen(command, env={**os.environ, **extra}))
        codes = wait_for_groups(groups)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if lighthouse is not None:
            lighthouse.terminate()
            lighthouse.wait()
    failed = [
        f"group {args.ft_first_group + i} (exit {code})"
        for i, code in enumerate(codes)
        if code not in (0, None)
    ]
    if failed:
        print(f"trainkit launch: {', '.join(failed)} failed", file=sys.stderr)
        return 1
    return 0


FINISH_GRACE = 120.0
"""Seconds the other groups get to end once one group has finished the run."""


def wait_for_groups(
    groups: Sequence[Any], grace: float = FINISH_GRACE, poll: float = 0.5
) -> list[int | None]:
    """Wait for every group; their exit codes, None for one stopped after the run ended.

    The groups commit the same steps, so one that exits 0 has finished the run. A group
    still running ``grace`` seconds later is one its torchrun restarted after the others
    were gone: alone, it would train from its own start again. It gets SIGTERM.
    """
    finished_at: float | None = None
    stopped: set[int] = set()
    while True:
        codes = [group.poll() for group in groups]
        if all(code is not None for code in codes):
            return [None if i in stopped else code for i, code in enumerate(codes)]
        if finished_at is None and 0 in codes:
            finished_at = time.monotonic()
        if finished_at is not None and time.monotonic() - finished_at > grace:
            for i, group in enumerate(groups):
                if codes[i] is None and i not in stopped:
                    stopped.add(i)
                    group.send_signal(signal.SIGTERM)
        time.sleep(poll)


def _forwarding(groups: Sequence[subprocess.Popen[bytes]]) -> Callable[[int, object], None]:
    def forward(signum: int, frame: object) -> None:
        for group in groups:
            if group.poll() is None:
                group.send_signal(signum)

    return forward


def _beside_python(name: str) -> str | None:
    # A virtual environment's scripts sit beside its interpreter, on PATH or not.
    path = os.path.join(os.path.dirname(sys.executable), name)
    return path if os.access(path, os.X_OK) else None


def _hostname() -> str:
    import socket

    return socket.gethostname()
