"""The one place trainkit reads the environment: torchrun's rank variables."""

from __future__ import annotations

import datetime
import os

import torch

__all__ = ["init_distributed_from_env"]


def init_distributed_from_env(timeout_seconds: float = 600.0) -> bool:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, ...).

    Returns False when not launched by torchrun (or with world size 1). A dead rank makes
    collectives fail after ``timeout_seconds`` instead of hanging the job.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or torch.distributed.is_initialized():
        return False
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.distributed.init_process_group(
        backend, timeout=datetime.timedelta(seconds=timeout_seconds)
    )
    return True
