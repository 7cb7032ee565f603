"""Process-group helpers that work the same with or without an initialised group, and
`init_distributed`, the one place trainkit reads the launcher's environment.

Without a process group (or with world size 1) every function acts as the identity for
one rank: rank 0, world size 1, broadcast returns the input, all-gather returns ``[obj]``.
"""

from __future__ import annotations

import datetime
import os
import re
import time
from collections.abc import Mapping
from typing import Any, TypeVar

import torch
import torch.distributed as _dist

__all__ = [
    "all_gather_object",
    "all_reduce",
    "any_rank",
    "barrier",
    "broadcast_object",
    "get_local_rank",
    "get_rank",
    "get_sampler",
    "get_world_size",
    "init_distributed",
    "is_initialized",
    "rendezvous_interval",
]

T = TypeVar("T")
_REDUCE_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}


_AVAILABLE = _dist.is_available()  # a build property: fixed for the process


def is_initialized() -> bool:
    return _AVAILABLE and _dist.is_initialized()


def get_rank() -> int:
    return _dist.get_rank() if _AVAILABLE and _dist.is_initialized() else 0


def get_world_size() -> int:
    # Asked every batch (DataSpec.count_batch): no extra call when alone.
    return _dist.get_world_size() if _AVAILABLE and _dist.is_initialized() else 1


def get_local_rank() -> int:
    """The rank within this node (the GPU index to use)."""
    if not is_initialized():
        return 0
    # torchrun sets LOCAL_RANK, srun SLURM_LOCALID. Groups started another way (fork-based
    # tests, custom launchers) are taken as one node per GPU set, or a single node without GPUs.
    local = os.environ.get("LOCAL_RANK")
    if local is None and _slurm_tasks(os.environ) > 1:
        local = os.environ.get("SLURM_LOCALID")
    if local is not None:
        return int(local)
    gpus = torch.cuda.device_count()
    return get_rank() % gpus if gpus else get_rank()


def barrier() -> None:
    if get_world_size() > 1:
        _dist.barrier()


def broadcast_object(obj: T, src: int = 0) -> T:
    """Rank ``src``'s ``obj`` on every rank (pickled: only for small, trusted values)."""
    if get_world_size() == 1:
        return obj
    holder = [obj]
    _dist.broadcast_object_list(holder, src=src)
    return holder[0]


def all_gather_object(obj: T) -> list[T]:
    """Every rank's ``obj``, in rank order."""
    if get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * get_world_size()
    _dist.all_gather_object(out, obj)
    return out


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Reduce ``tensor`` in place over all ranks with ``op`` in sum/max/min; returns it."""
    # Checked on every world size, so a bad op fails in single-process tests too.
    if op not in _REDUCE_OPS:
        raise ValueError(f"all_reduce op {op!r} is not supported; use one of {sorted(_REDUCE_OPS)}")
    if get_world_size() > 1:
        _dist.all_reduce(tensor, op=getattr(_dist.ReduceOp, _REDUCE_OPS[op]))
    return tensor


def any_rank(flag: bool, device: torch.device | str = "cpu") -> bool:
    """True on every rank if ``flag`` is true on any rank (one collective when distributed)."""
    if get_world_size() == 1:
        return flag
    tensor = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    return bool(all_reduce(tensor, "max").item())


# --- starting the process group -------------------------------------------------------

_BACKENDS = ("auto", "gloo", "nccl")
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def init_distributed(
    *,
    backend: str = "auto",
    timeout: float | datetime.timedelta = 600.0,
    single_process: bool = True,
    env: Mapping[str, str] | None = None,
) -> bool:
    """Initialise the default process group, once, before building the `Trainer`.

    Under torchrun (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set) every
    rank joins the job's group; on CUDA the rank also selects GPU ``LOCAL_RANK``. Under
    SLURM's ``srun`` with one task per process and no torchrun, the same comes from
    ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS`` and ``SLURM_LOCALID``, at the first host of the
    step's node list (``MASTER_ADDR`` and ``MASTER_PORT`` override the address and the port,
    which is otherwise 10000 + ``SLURM_JOB_ID`` % 20000). Without a launcher, a one-rank
    group is started when ``single_process`` (parallel strategies need a group even alone:
    FSDP at world size 1), on a TCPStore this process hosts on a port the OS picks (port 0,
    so no free-port guess can race); else nothing is started. Call it before the `Trainer`:
    the Trainer agrees on a seed and picks each rank's device when built. This is the one
    place trainkit reads the environment (torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
    ``MASTER_PORT``, or SLURM's); the CLI and trainkit-parallel call it.

    Args:
        backend: ``"auto"`` (NCCL when CUDA is available, else gloo), ``"gloo"`` or
            ``"nccl"``.
        timeout: seconds (or a timedelta) a collective may wait for the other ranks; a
            dead or stuck rank then fails the job instead of hanging it.
        single_process: outside torchrun, start a one-rank group (True) or nothing (False).
        env: the environment to read (default: ``os.environ``).

    Returns:
        True if this call started a group, False if one was already running or none was
        needed.

    Raises:
        ValueError: an unknown backend, NCCL without a CUDA device, a timeout that is not
            positive, or an incomplete torchrun or SLURM environment.
    """
    env = os.environ if env is None else env
    backend = _resolve_backend(backend)
    timeout = _check_timeout(timeout)
    if _dist.is_initialized():
        return False
    began = time.time()
    launcher = _launcher_env(env)
    if launcher is None:
        if not single_process:
            return False
        # One rank, no launcher: a store on a port the OS picks (no free-port guess to race).
        if backend == "nccl":
            torch.cuda.set_device(0)
        store = _dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timeout)
        _dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)
        _rendezvous[os.getpid()] = (began, time.time())
        return True
    rank, world_size, local_rank, address, port = launcher
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    _dist.init_process_group(
        backend,
        init_method=f"tcp://{_host(address)}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timeout,
    )
    _rendezvous[os.getpid()] = (began, time.time())
    return True


_rendezvous: dict[int, tuple[float, float]] = {}  # by pid: a forked child starts its own


def rendezvous_interval() -> tuple[float, float] | None:
    """When `init_distributed` started this process's group: ``time.time()`` before and
    after (None: it started none). The Trainer reports it in its restart time."""
    return _rendezvous.get(os.getpid())


def get_sampler(
    dataset: Any, *, shuffle: bool = False, drop_last: bool = False, seed: int = 0
) -> torch.utils.data.DistributedSampler:
    """A `DistributedSampler` giving this rank its share of ``dataset`` (as Composer's
    ``dist.get_sampler``). Usable before the Trainer starts the process group: the rank
    and world size then come from the launcher's environment (torchrun's ``RANK`` and
    ``WORLD_SIZE``; one rank without a launcher). The Trainer keeps the order resumable."""
    if is_initialized():
        rank, world_size = get_rank(), get_world_size()
    elif _launched_world_size() > 1:
        rank, world_size, *_ = _launcher_env(os.environ) or (0, 1)
    else:
        rank, world_size = 0, 1
    return torch.utils.data.DistributedSampler(
        dataset,
        num_replicas=world_size,
        rank=rank,
        shuffle=shuffle,
        drop_last=drop_last,
        seed=seed,
    )


def _launched_world_size(env: Mapping[str, str] | None = None) -> int:
    """The world size a launcher set (torchrun's ``WORLD_SIZE``, srun's step); 1 without one.

    A value that is not a number counts as more than one rank, so that `init_distributed`
    reports it.
    """
    env = os.environ if env is None else env
    try:
        return int(env["WORLD_SIZE"]) if "WORLD_SIZE" in env else _slurm_tasks(env)
    except ValueError:
        return 2


def _launcher_env(env: Mapping[str, str]) -> tuple[int, int, int, str, int] | None:
    """(rank, world size, local rank, address, port) from torchrun's or srun's variables;
    None without a multi-rank launcher."""
    if "RANK" not in env and "WORLD_SIZE" not in env and _slurm_tasks(env) > 1:
        return _read_slurm_env(env)
    return _read_env(env) if any(name in env for name in _TORCHRUN_VARS) else None


def _slurm_tasks(env: Mapping[str, str]) -> int:
    """The tasks of this srun step (1 outside one: a batch script's SLURM_NTASKS counts
    tasks that only an srun would start)."""
    if "SLURM_PROCID" not in env or "SLURM_STEP_NUM_TASKS" not in env:
        return 1
    tasks = env["SLURM_STEP_NUM_TASKS"]
    if not tasks.isdigit():
        raise ValueError(f"SLURM_STEP_NUM_TASKS must be an integer, got {tasks!r}")
    return int(tasks)


def _resolve_backend(backend: str) -> str:
    if backend not in _BACKENDS:
        raise ValueError(f"backend {backend!r} is not supported; use one of {list(_BACKENDS)}")
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError(
            "backend 'nccl' needs CUDA GPUs, and none is available on this machine; use "
            "backend='gloo' (or 'auto') to run on CPU"
        )
    return backend


def _check_timeout(timeout: float | datetime.timedelta) -> datetime.timedelta:
    if isinstance(timeout, bool) or not isinstance(timeout, int | float | datetime.timedelta):
        raise ValueError(
            f"timeout {timeout!r} is not a duration; give seconds (e.g. 600) or a timedelta"
        )
    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=timeout)
    if timeout.total_seconds() <= 0:
        raise ValueError(f"timeout must be positive, got {timeout.total_seconds()} s")
    return timeout


def _read_env(env: Mapping[str, str]) -> tuple[int, int, int, str, int]:
    """(rank, world size, local rank, master address, master port) from torchrun's variables."""
    present = [name for name in _TORCHRUN_VARS if name in env]
    missing = [name for name in _TORCHRUN_VARS if name not in env]
    if missing:
        raise ValueError(
            f"incomplete torchrun environment: {present} are set but {missing} are not; "
            "launch with `torchrun` / `trainkit launch`, or set all of "
            f"{list(_TORCHRUN_VARS)}"
        )
    values = {name: env[name] for name in (*_TORCHRUN_VARS[:2], "MASTER_PORT")}
    values["LOCAL_RANK"] = env.get("LOCAL_RANK", "0")
    try:
        numbers = {name: int(value) for name, value in values.items()}
    except ValueError:
        raise ValueError(
            f"torchrun variables must be integers, got {values}; launch with `torchrun`"
        ) from None
    rank, world_size = numbers["RANK"], numbers["WORLD_SIZE"]
    if not 0 <= rank < world_size:
        raise ValueError(f"RANK={rank} is outside 0..WORLD_SIZE-1 (WORLD_SIZE={world_size})")
    return rank, world_size, numbers["LOCAL_RANK"], env["MASTER_ADDR"], numbers["MASTER_PORT"]


def _read_slurm_env(env: Mapping[str, str]) -> tuple[int, int, int, str, int]:
    """(rank, world size, local rank, address, port) in an srun step, one task per process."""
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    needed = {
        "SLURM_LOCALID": env.get("SLURM_LOCALID"),
        "SLURM_STEP_NODELIST or SLURM_JOB_NODELIST (or MASTER_ADDR)": env.get("MASTER_ADDR")
        or nodes,
        "SLURM_JOB_ID (or MASTER_PORT)": env.get("MASTER_PORT") or env.get("SLURM_JOB_ID"),
    }
    missing = [name for name, value in needed.items() if not value]
    if missing:
        raise ValueError(
            f"an srun step of {env['SLURM_STEP_NUM_TASKS']} tasks, but {missing} are not "
            "set: srun sets them for each task it starts (export MASTER_ADDR and MASTER_PORT "
            "to choose the address yourself)"
        )
    try:
        rank, local_rank = int(env["SLURM_PROCID"]), int(env["SLURM_LOCALID"])
        port = int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else None
        port = port or 10000 + int(env["SLURM_JOB_ID"]) % 20000
    except ValueError:
        raise ValueError(
            "SLURM_PROCID, SLURM_LOCALID, SLURM_JOB_ID and MASTER_PORT must be integers, got "
            f"{[env.get(n) for n in ('SLURM_PROCID', 'SLURM_LOCALID', 'SLURM_JOB_ID', 'MASTER_PORT')]}"
        ) from None
    world_size = _slurm_tasks(env)
    if not 0 <= rank < world_size:
        raise ValueError(f"SLURM_PROCID={rank} is outside 0..{world_size - 1} (the step's tasks)")
    return rank, world_size, local_rank, env.get("MASTER_ADDR") or _first_host(nodes or ""), port


def _first_host(nodes: str) -> str:
    """The first host of a SLURM host list: ``"gpu[007-009,12],cpu1"`` -> ``"gpu007"``."""
    host = ""
    for part in re.split(r"(\[[^\]]*\])", nodes):
        if part.startswith("["):
            host += re.split(r"[,-]", part[1:-1])[0]
        elif "," in part or "[" in part:
            host += part.split(",")[0]
            break
        else:
            host += part
    if not host or "[" in host or "]" in host:
        raise ValueError(f"SLURM node list {nodes!r} is not a host list like 'node[01-04],gpu7'")
    return host


def _host(address: str) -> str:
    # An IPv6 literal needs brackets inside a URL.
    return f"[{address}]" if ":" in address and not address.startswith("[") else address
