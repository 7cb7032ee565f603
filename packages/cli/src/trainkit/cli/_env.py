"""The one place trainkit reads the environment: torchrun's rank variables."""

from __future__ import annotations

import datetime
import os
import socket

import torch

__all__ = ["init_distributed_from_env"]


def init_distributed_from_env(
    timeout_seconds: float = 600.0, *, single_process_group: bool = False
) -> bool:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, ...).

    Outside torchrun, starts a one-rank group when ``single_process_group`` (parallel
    strategies need one even alone), else does nothing and returns False. A dead rank
    makes collectives fail after ``timeout_seconds`` instead of hanging the job.
    """
    if torch.distributed.is_initialized():
        return False
    timeout = datetime.timedelta(seconds=timeout_seconds)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group(backend, timeout=timeout)
        return True
    if single_process_group:
        torch.distributed.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{_free_port()}",
            rank=0,
            world_size=1,
            timeout=timeout,
        )
        return True
    return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
