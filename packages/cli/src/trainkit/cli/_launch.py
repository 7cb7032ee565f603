"""``trainkit launch``: run a script, a module or ``train CONFIG`` on N processes with torchrun.

Everything process-related is torch.distributed.run's elastic agent: rendezvous, restarts,
per-rank output, and shutdown (on SIGTERM or SIGINT every rank gets SIGTERM, then SIGKILL
after 30 s). The exit status is 1 when a rank fails, and 75 (`PREEMPTED_EXIT_CODE`) when
the launch was stopped by a signal or its ranks were preempted: a trainkit ``fit`` then
saved a checkpoint, and the run resumes from it when launched again with autoresume.
"""

from __future__ import annotations

import argparse
import os
import sys

from trainkit.cli import _launch_ft

__all__ = ["LINE_PREFIX", "add_parser", "run", "torchrun_args"]

# Each line a rank prints starts with its global rank. Set through torchrun's environment
# variable, which every torch release with this feature reads (the command-line option
# came later: torch 2.11's torchrun passes an unknown option on to the ranks' Python).
LINE_PREFIX = ("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[rank${rank}]: ")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "launch",
        help="run a script, module or 'train CONFIG' on several processes (torchrun)",
        description="Run on N processes per node with torch.distributed.run. Examples: "
        "trainkit launch -n 8 train config.yaml; trainkit launch -n 2 my_script.py --lr 0.1; "
        "trainkit launch -n 4 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 -m my.module",
    )
    parser.add_argument(
        "-n", "--nproc-per-node", type=int, required=True, help="processes on this node"
    )
    parser.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's rank (multi-node)")
    parser.add_argument("--master-addr", help="address of node 0 (multi-node)")
    parser.add_argument(
        "--master-port", type=int, default=29500, help="port on node 0 (default 29500)"
    )
    parser.add_argument(
        "--max-restarts", type=int, default=0, help="restart the group this many times on failure"
    )
    parser.add_argument("--log-dir", help="also write each rank's output to files in this folder")
    parser.add_argument(
        "-m", "--module", action="store_true", help="TARGET is a module (python -m)"
    )
    _launch_ft.add_ft_options(parser)
    parser.add_argument("target", help="a script, a module with -m, or 'train'")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the target")
    parser.set_defaults(handler=run)


def torchrun_args(args: argparse.Namespace) -> list[str]:
    """The torch.distributed.run command line for ``args``."""
    if args.nproc_per_node < 1 or args.nnodes < 1:
        raise ValueError(
            f"-n and --nnodes must be at least 1, got {args.nproc_per_node} and {args.nnodes}"
        )
    if args.nnodes > 1 and not args.master_addr:
        raise ValueError("--nnodes > 1 needs --master-addr (the address of node 0)")
    if not 0 <= args.node_rank < args.nnodes:
        raise ValueError(f"--node-rank {args.node_rank} is not in [0, {args.nnodes})")
    command = [
        f"--nproc-per-node={args.nproc_per_node}",
        f"--nnodes={args.nnodes}",
        f"--max-restarts={args.max_restarts}",
        "--tee=3",
    ]
    if args.nnodes == 1 and not args.master_addr:
        command.append("--standalone")
    else:
        command += [
            f"--node-rank={args.node_rank}",
            f"--master-addr={args.master_addr}",
            f"--master-port={args.master_port}",
        ]
    if args.log_dir:
        command.append(f"--log-dir={args.log_dir}")
    if args.target == "train" and not args.module:
        return [*command, "-m", "trainkit.cli", "train", *args.args]
    return [*command, *(["-m"] if args.module else []), args.target, *args.args]


def run(args: argparse.Namespace) -> int:
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    from trainkit.core import PREEMPTED_EXIT_CODE

    if args.ft_groups:  # replica groups of a fault-tolerant run, each its own torchrun
        return _launch_ft.run_groups(args, torchrun_args)
    command = torchrun_args(args)
    os.environ.setdefault(*LINE_PREFIX)  # a template the user set wins
    try:
        torchrun(command)
    except SignalException as err:
        # torchrun forwarded the signal to every rank and waited for them (30 s at most):
        # a trainkit fit saves a checkpoint and exits 75 then, so the launch is "retry later".
        print(
            f"trainkit launch: stopped by {err.sigval.name}, forwarded to every rank "
            f"(exit {PREEMPTED_EXIT_CODE}: preempted)",
            file=sys.stderr,
        )
        return PREEMPTED_EXIT_CODE
    except ChildFailedError as err:
        codes = {f.exitcode for f in err.failures.values()}
        if codes == {PREEMPTED_EXIT_CODE}:  # the ranks were signalled directly
            print("trainkit launch: every rank that stopped was preempted", file=sys.stderr)
            return PREEMPTED_EXIT_CODE
        failures = ", ".join(
            f"rank {rank} (exit {f.exitcode})" for rank, f in sorted(err.failures.items())
        )
        print(f"trainkit launch: {failures} failed", file=sys.stderr)
        return 1
    return 0
