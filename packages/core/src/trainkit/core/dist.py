"""Process-group helpers that work the same with or without an initialised group.

Without a process group (or with world size 1) every function acts as the identity for
one rank: rank 0, world size 1, broadcast returns the input, all-gather returns ``[obj]``.
"""

from __future__ import annotations

import os
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
    "get_world_size",
    "is_initialized",
]

T = TypeVar("T")
_REDUCE_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}


def is_initialized() -> bool:
    return _dist.is_available() and _dist.is_initialized()


def get_rank() -> int:
    return _dist.get_rank() if is_initialized() else 0


def get_world_size() -> int:
    return _dist.get_world_size() if is_initialized() else 1


def get_local_rank() -> int:
    """The rank within this node (the GPU index to use)."""
    if not is_initialized():
        return 0
    # torchrun sets LOCAL_RANK. Groups started another way (fork-based tests, custom
    # launchers) are taken as one node per GPU set, or a single node without GPUs.
    local = os.environ.get("LOCAL_RANK")
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
