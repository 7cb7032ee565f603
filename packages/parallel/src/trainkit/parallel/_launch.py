"""Starting the process group from the torchrun environment.

This is the one place in trainkit.parallel that reads environment variables: ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` are torchrun's contract
(``trainkit launch`` runs on torchrun and sets the same ones).
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Mapping

import torch
import torch.distributed as dist

__all__ = ["init_distributed"]

_BACKENDS = ("auto", "gloo", "nccl")
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def init_distributed(
    *,
    backend: str = "auto",
    timeout: float | datetime.timedelta = 600.0,
    env: Mapping[str, str] | None = None,
) -> bool:
    """Initialise the default process group, once, before building the `Trainer`.

    Under torchrun (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set) every
    rank joins the job's group; on CUDA the rank also selects GPU ``LOCAL_RANK``. Without
    torchrun's variables, a one-rank group is started on a free local port, so the same
    script runs as a single process (FSDP at world size 1, for example). Call it before
    the `Trainer`: the Trainer agrees on a seed and picks each rank's device when built.

    Args:
        backend: ``"auto"`` (NCCL when CUDA is available, else gloo), ``"gloo"`` or
            ``"nccl"``.
        timeout: seconds (or a timedelta) a collective may wait for the other ranks; a
            dead or stuck rank then fails the job instead of hanging it.
        env: the environment to read (default: ``os.environ``).

    Returns:
        True if this call started the group, False if one was already running.

    Raises:
        ValueError: an unknown backend, NCCL without a CUDA device, a timeout that is not
            positive, or an incomplete torchrun environment.
    """
    env = os.environ if env is None else env
    backend = _resolve_backend(backend)
    timeout = _check_timeout(timeout)
    if dist.is_initialized():
        return False
    rank, world_size, local_rank, address, port = _read_env(env)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(
        backend,
        init_method=f"tcp://{_host(address)}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timeout,
    )
    return True


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
    if not present:
        return 0, 1, 0, "127.0.0.1", _free_port()
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


def _host(address: str) -> str:
    # An IPv6 literal needs brackets inside a URL.
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
