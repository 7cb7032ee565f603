"""``trainkit launch``: run a script, a module or ``train CONFIG`` on N processes with torchrun.

Everything process-related is torch.distributed.run's elastic agent: rendezvous, restarts,
per-rank output, and shutdown (on SIGTERM or SIGINT every rank gets SIGTERM, then SIGKILL
after 30 s). The exit status is 1 when a rank fails, and 75 (`PREEMPTED_EXIT_CODE`) when
the launch was stopped by a signal or its ranks were preempted: a trainkit ``fit`` then
saved a checkpoint, and the run resumes from it when launched again with autoresume.

Nodes meet in one of two ways, as with torchrun: the static ``--master-addr`` (a fixed
number of nodes, each told its ``--node-rank``), or the c10d rendezvous at
``--rdzv-endpoint`` (elastic: ``--nnodes MIN:MAX``, node ranks assigned at each round,
and a failed or lost node makes the others restart their workers at the new size).
"""

from __future__ import annotations

import argparse
import os
import sys

from trainkit.cli import _launch_ft

__all__ = ["FRESH_STORE_PER_ROUND", "LINE_PREFIX", "add_parser", "run", "torchrun_args"]

# Each line a rank prints starts with its global rank. Set through torchrun's environment
# variable, which every torch release with this feature reads (the command-line option
# came later: torch 2.11's torchrun passes an unknown option on to the ranks' Python).
LINE_PREFIX = ("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[rank${rank}]: ")

# A fresh store for the workers' process group at each rendezvous round (rank 0's worker
# hosts it on a new port), not torch's default of one store shared by every round: a
# restarted rank read the previous round's keys there, so it dialled a dead rank's gloo
# port ("Connection refused") or waited for one, and the restarted group never formed.
FRESH_STORE_PER_ROUND = ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")

# The c10d rendezvous' settings (torch.distributed.elastic.rendezvous): torch ignores a key
# it does not know, so a typo would pass silently; these are the ones it reads.
RDZV_CONF_KEYS = (
    "join_timeout",
    "last_call_timeout",
    "close_timeout",
    "heartbeat_timeout",
    "keep_alive_interval",
    "keep_alive_max_attempt",
    "read_timeout",
    "is_host",
    "store_type",
    "cas_backoff_max_seconds",
)
DEFAULT_RDZV_PORT = 29400  # torchrun's, for an endpoint given without a port


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "launch",
        help="run a script, module or 'train CONFIG' on several processes (torchrun)",
        description="Run on N processes per node with torch.distributed.run. Examples: "
        "trainkit launch -n 8 train config.yaml; trainkit launch -n 2 my_script.py --lr 0.1; "
        "trainkit launch -n 4 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 -m my.module; "
        "trainkit launch -n 8 --nnodes 1:4 --rdzv-endpoint node0:29400 --rdzv-id job7 "
        "--max-restarts 3 train config.yaml",
    )
    parser.add_argument(
        "-n", "--nproc-per-node", type=int, required=True, help="processes on this node"
    )
    _add_node_arguments(parser)
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="restart this node's workers this many times after a failure (default 0)",
    )
    parser.add_argument("--log-dir", help="also write each rank's output to files in this folder")
    parser.add_argument(
        "-m", "--module", action="store_true", help="TARGET is a module (python -m)"
    )
    _launch_ft.add_ft_options(parser)
    parser.add_argument("target", help="a script, a module with -m, or 'train'")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the target")
    parser.set_defaults(handler=run)


def _add_node_arguments(parser: argparse.ArgumentParser) -> None:
    nodes = parser.add_argument_group(
        "nodes", "static (--master-addr) or elastic (c10d rendezvous at --rdzv-endpoint)"
    )
    nodes.add_argument(
        "--nnodes",
        default="1",
        help="number of nodes N, or a range MIN:MAX (elastic; needs --rdzv-endpoint); default 1",
    )
    nodes.add_argument(
        "--node-rank", type=int, help="this node's rank (static --master-addr only; default 0)"
    )
    nodes.add_argument("--master-addr", help="address of node 0 (static multi-node)")
    nodes.add_argument(
        "--master-port", type=int, help="port on node 0 (static multi-node; default 29500)"
    )
    nodes.add_argument(
        "--rdzv-endpoint",
        help=f"HOST[:PORT] of the c10d rendezvous store (default port {DEFAULT_RDZV_PORT}); "
        "the node at HOST hosts it, every node gives the same",
    )
    nodes.add_argument(
        "--rdzv-backend",
        choices=("c10d", "static"),
        help="c10d (the default with --rdzv-endpoint) or static (with --master-addr)",
    )
    nodes.add_argument(
        "--rdzv-id", help="the job's id, the same on every node (c10d; e.g. $SLURM_JOB_ID)"
    )
    nodes.add_argument(
        "--rdzv-conf",
        help="c10d settings KEY=VALUE,... (" + ", ".join(RDZV_CONF_KEYS) + ")",
    )


def _parse_nnodes(value: str) -> tuple[int, int]:
    """``"N"`` -> (N, N); ``"MIN:MAX"`` -> (MIN, MAX), checked."""
    low, colon, high = value.partition(":")
    try:
        nodes = int(low), int(high if colon else low)
    except ValueError:
        nodes = (0, 0)
    if min(nodes) < 1:
        raise ValueError(
            f"--nnodes {value!r} is not a node count; give N or MIN:MAX with integers >= 1 "
            "(e.g. 2 or 1:4)"
        )
    if nodes[0] > nodes[1]:
        raise ValueError(f"--nnodes {value!r}: MIN {nodes[0]} is larger than MAX {nodes[1]}")
    return nodes


def _rdzv_conf(value: str) -> str:
    pairs = [pair.strip() for pair in value.split(",") if pair.strip()]
    for pair in pairs:
        key, equals, setting = pair.partition("=")
        if not equals or not setting.strip():
            raise ValueError(f"--rdzv-conf {pair!r} is not KEY=VALUE (e.g. last_call_timeout=5)")
        if key.strip() not in RDZV_CONF_KEYS:
            raise ValueError(
                f"--rdzv-conf: unknown setting {key.strip()!r}; the c10d rendezvous reads "
                f"{', '.join(RDZV_CONF_KEYS)}"
            )
    return ",".join(pairs)


def _endpoint(value: str) -> str:
    """``HOST[:PORT]`` (``[IPv6]:PORT``), checked, with torchrun's default port if none."""
    if value.startswith("["):
        host, _, port = value.partition("]")
        host, port = host + "]", port.removeprefix(":")
    else:
        host, _, port = value.partition(":")
    port = port or str(DEFAULT_RDZV_PORT)
    if host in ("", "[]") or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"--rdzv-endpoint {value!r} is not HOST:PORT (e.g. node0:29400, 10.0.0.1:29400 "
            "or [fd00::1]:29400)"
        )
    return f"{host}:{port}"


def _node_args(args: argparse.Namespace) -> list[str]:
    """torchrun's node and rendezvous options for ``args``, after checking their combination."""
    low, high = _parse_nnodes(str(args.nnodes))
    rdzv_only = {"--rdzv-id": args.rdzv_id, "--rdzv-conf": args.rdzv_conf}
    given = [name for name, value in rdzv_only.items() if value is not None]
    if given and args.rdzv_endpoint is None:
        raise ValueError(
            f"{' and '.join(given)}: options of the c10d rendezvous at --rdzv-endpoint "
            "HOST:PORT; give one, or leave them out (one node, or the static --master-addr)"
        )
    if args.rdzv_backend == "c10d" or args.rdzv_endpoint is not None:
        return _elastic_args(args, low, high)
    return _static_args(args, low, high)


def _elastic_args(args: argparse.Namespace, low: int, high: int) -> list[str]:
    static_only = {
        "--master-addr": args.master_addr,
        "--master-port": args.master_port,
        "--node-rank": args.node_rank,
    }
    given = [name for name, value in static_only.items() if value is not None]
    if args.rdzv_backend == "static" or given:
        raise ValueError(
            f"{' and '.join(given) or '--rdzv-backend static'} cannot be combined with "
            "the c10d rendezvous (--rdzv-endpoint), which assigns node ranks itself. Use "
            "either --rdzv-endpoint HOST:PORT (elastic) or --master-addr with --node-rank "
            "(static)"
        )
    command = [f"--nnodes={low}:{high}", "--rdzv-backend=c10d"]
    if args.rdzv_endpoint is None:
        if high > 1:
            raise ValueError(
                f"--nnodes {args.nnodes} with the c10d rendezvous needs --rdzv-endpoint "
                "HOST:PORT (a host every node can reach)"
            )
        return [*command, "--standalone"]  # one node: a store of its own on a free port
    command.append(f"--rdzv-endpoint={_endpoint(args.rdzv_endpoint)}")
    if args.rdzv_id is not None:
        command.append(f"--rdzv-id={args.rdzv_id}")
    if args.rdzv_conf:
        command.append(f"--rdzv-conf={_rdzv_conf(args.rdzv_conf)}")
    return command


def _static_args(args: argparse.Namespace, low: int, high: int) -> list[str]:
    if low != high:
        raise ValueError(
            f"--nnodes {args.nnodes} is a range: an elastic job needs the c10d rendezvous; "
            "add --rdzv-endpoint HOST:PORT (the static --master-addr path takes a fixed N)"
        )
    node_rank = 0 if args.node_rank is None else args.node_rank
    if high > 1 and not args.master_addr:
        raise ValueError(
            f"--nnodes {high} needs --rdzv-endpoint HOST:PORT (c10d, elastic) or "
            "--master-addr (the address of node 0, static)"
        )
    if not 0 <= node_rank < high:
        raise ValueError(f"--node-rank {node_rank} is not in [0, {high})")
    if high == 1 and not args.master_addr:
        return ["--nnodes=1", "--standalone"]
    return [
        f"--nnodes={high}",
        f"--node-rank={node_rank}",
        f"--master-addr={args.master_addr}",
        f"--master-port={29500 if args.master_port is None else args.master_port}",
    ]


def torchrun_args(args: argparse.Namespace) -> list[str]:
    """The torch.distributed.run command line for ``args``."""
    if args.nproc_per_node < 1:
        raise ValueError(f"-n must be at least 1, got {args.nproc_per_node}")
    if args.max_restarts < 0:
        raise ValueError(f"--max-restarts must be 0 or more, got {args.max_restarts}")
    command = [
        f"--nproc-per-node={args.nproc_per_node}",
        *_node_args(args),
        f"--max-restarts={args.max_restarts}",
        "--tee=3",
    ]
    if args.log_dir:
        command.append(f"--log-dir={args.log_dir}")
    if args.target == "train" and not args.module:
        return [*command, "-m", "trainkit.cli", "train", *args.args]
    return [*command, *(["-m"] if args.module else []), args.target, *args.args]


def run(args: argparse.Namespace) -> int:
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.run import main as torchrun

    from trainkit.core import PREEMPTED_EXIT_CODE

    if args.ft_groups:  # replica groups of a fault-tolerant run, each its own torchrun
        return _launch_ft.run_groups(args, torchrun_args)
    command = torchrun_args(args)
    os.environ.setdefault(*LINE_PREFIX)  # a template the user set wins
    os.environ.setdefault(*FRESH_STORE_PER_ROUND)  # as does the user's choice
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
    except RendezvousError as err:
        # Fewer than MIN nodes within join_timeout, the store unreachable or its host lost.
        print(
            f"trainkit launch: the nodes did not meet at the rendezvous "
            f"{args.rdzv_endpoint or '(this node)'}: {type(err).__name__}: {err}",
            file=sys.stderr,
        )
        return 1
    return 0
