"""Where the run's processes and model live: joining (or starting) the process group, and
the parallel strategy a run trains with when none is given."""

from __future__ import annotations

import logging

import torch
from torch import nn

from trainkit.core import Device, ParallelStrategy, SingleProcess, dist, plugins
from trainkit.core.messages import warn
from trainkit.core.precision import check_device

__all__ = ["distributed_by_user", "join_process_group", "resolve_parallelism"]

log = logging.getLogger(__name__)


def join_process_group(
    strategy: ParallelStrategy | None, device: str | torch.device | None
) -> None:
    """Start the process group when the run needs one and none exists, as Composer does:
    under a multi-rank launcher (torchrun's ``WORLD_SIZE`` > 1) every rank joins the job's
    group; alone, a strategy that ``needs_process_group`` (FSDP on one device) gets a
    one-rank group. gloo for a CPU run, else NCCL when CUDA is there."""
    if dist.is_initialized():
        return
    launched = dist._launched_world_size() > 1
    if not launched and not (strategy is not None and strategy.needs_process_group):
        return
    cpu = check_device(device) == Device.CPU or (
        isinstance(device, torch.device) and device.type == "cpu"
    )
    dist.init_distributed(backend="gloo" if cpu else "auto", single_process=not launched)
    if not launched:
        log.info("started a one-rank process group for %s", type(strategy).__name__)


def resolve_parallelism(given: ParallelStrategy | None, model: nn.Module) -> ParallelStrategy:
    """The strategy to train with: DDP by default at world size > 1, so that ranks never
    train diverging replicas without being asked to."""
    world_size = dist.get_world_size()
    if world_size == 1 or distributed_by_user(model):
        return given if given is not None else SingleProcess()
    if given is None:
        if "ddp" not in plugins.available("trainkit.parallel"):
            raise ImportError(
                f"this run has {world_size} ranks and no parallelism= was given: the default is "
                "data parallelism (DDP), which comes with trainkit-parallel, and it is not "
                "installed. Install it (`pip install trainkit-parallel`), or pass a strategy: "
                "parallelism=SingleProcess() trains an independent replica on each rank, on "
                "purpose"
            )
        return plugins.load("trainkit.parallel", "ddp")()
    if type(given) is SingleProcess:
        warn(
            f"parallelism=SingleProcess() with {world_size} ranks: each rank trains its own "
            "replica, gradients are not averaged and the ranks' weights will differ. Leave "
            "parallelism unset for data parallelism (DDP) if you want one model",
            RuntimeWarning,
        )
    return given


def distributed_by_user(model: nn.Module) -> bool:
    """Whether the model synchronises across ranks itself (wrapped or sharded before the
    Trainer: DDP, FSDP, DTensor parameters), so no strategy must be added to it."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    wrappers = (nn.parallel.DistributedDataParallel, FullyShardedDataParallel, FSDPModule)
    return any(isinstance(m, wrappers) for m in model.modules()) or any(
        isinstance(p, DTensor) for p in model.parameters()
    )
