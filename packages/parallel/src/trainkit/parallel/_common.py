"""Checks and helpers shared by the strategies."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from trainkit.core import MixedPrecision, Precision

__all__ = [
    "ModuleSelector",
    "broadcast_module_states",
    "check_not_wrapped",
    "require_process_group",
    "select_modules",
    "sharded_precision",
]

ModuleSelector = Sequence[type[nn.Module]] | type[nn.Module] | Callable[[nn.Module], bool]
"""Which submodules to act on: module classes, or a predicate ``module -> bool``."""


def require_process_group(strategy: str) -> int:
    """The world size; raises if no process group is running."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{strategy} needs a process group, and none is initialised: call "
            "trainkit.core.dist.init_distributed() at the start of the script, before building "
            "the Trainer (launch several ranks with `torchrun` or `trainkit launch`)"
        )
    return dist.get_world_size()


def check_not_wrapped(model: nn.Module, strategy: str) -> None:
    """Raise `TypeError` if a parallel wrapper or sharding was already applied to ``model``."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    wrappers = (
        nn.parallel.DistributedDataParallel,
        nn.DataParallel,
        FullyShardedDataParallel,
        FSDPModule,
    )
    for name, module in model.named_modules():
        if isinstance(module, wrappers):
            where = f"its submodule {name!r}" if name else "it"
            raise TypeError(
                f"{strategy} got a model that is already distributed: {where} is a "
                f"{type(module).__name__}. Pass the plain module and let the strategy wrap it "
                "(DDP(), FSDP(...), TensorParallel(...), or FSDP(tensor_parallel=...) for both)"
            )
    for name, param in model.named_parameters():
        if isinstance(param, DTensor):
            raise TypeError(
                f"{strategy} got a model whose parameter {name!r} is already a DTensor "
                f"(placements {param.placements}): tensor parallelism or sharding was applied "
                "before the Trainer. Pass the plain module and give the plan to the strategy: "
                "FSDP(tensor_parallel=TensorParallel(plan=plan, degree=d))"
            )


def select_modules(model: nn.Module, selector: ModuleSelector, what: str) -> list[nn.Module]:
    """Submodules chosen by ``selector`` (classes or a predicate), deepest first.

    Deepest first is the order FSDP needs: inner groups are sharded before the modules
    that contain them.
    """
    if isinstance(selector, type) and issubclass(selector, nn.Module):
        selector = (selector,)
    if isinstance(selector, Sequence) and not isinstance(selector, str):
        classes = tuple(selector)
        bad = [c for c in classes if not (isinstance(c, type) and issubclass(c, nn.Module))]
        if bad or not classes:
            raise TypeError(
                f"{what} must be nn.Module classes or a callable module -> bool, got {selector!r}"
            )
        return _deepest_first(model, lambda m: isinstance(m, classes))
    if callable(selector):
        return _deepest_first(model, selector)
    raise TypeError(
        f"{what} must be nn.Module classes or a callable module -> bool, got {selector!r}"
    )


def _deepest_first(model: nn.Module, keep: Callable[[nn.Module], Any]) -> list[nn.Module]:
    # modules() lists parents before children; reversed, children come first.
    return [m for m in reversed(list(model.modules())) if bool(keep(m))]


@torch.no_grad()
def broadcast_module_states(model: nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank (like DDP does at start).

    Alone in the group there is nothing to copy: no collective is issued (on NCCL, one per
    tensor of the model).
    """
    if dist.get_world_size() == 1:
        return
    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=src)


def sharded_precision(precision: Precision) -> Precision:
    """``precision`` with a `ShardedGradScaler` when it scales the loss, else unchanged.

    Each rank sees only its shard's gradients, so whether any is inf or nan must be agreed
    by all ranks, or some would skip the step and others not. The sharded scaler starts
    with the settings of the scaler it replaces (scale, growth and backoff).
    """
    if not precision.scales_loss:
        return precision
    dtype = precision.autocast_dtype
    if dtype is None:
        raise TypeError(
            f"{precision!r} scales the loss but does not autocast; a parallel strategy that "
            "shards gradients only knows how to shard MixedPrecision's gradient scaler"
        )
    settings = _scaler_settings(precision)
    device_type = precision.device.type

    def scaler_factory() -> torch.amp.GradScaler:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device=device_type, **settings)

    return MixedPrecision(precision.device, dtype, scaler_factory=scaler_factory)


def _scaler_settings(precision: Precision) -> dict[str, Any]:
    scaler = precision.scaler if isinstance(precision, MixedPrecision) else None
    if scaler is None:
        return {}
    return {
        "init_scale": scaler.get_scale() if scaler.is_enabled() else 2.0**16,
        "growth_factor": scaler.get_growth_factor(),
        "backoff_factor": scaler.get_backoff_factor(),
        "growth_interval": scaler.get_growth_interval(),
        "enabled": scaler.is_enabled(),
    }
