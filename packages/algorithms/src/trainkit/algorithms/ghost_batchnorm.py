"""Ghost BatchNorm (Hoffer et al. 2017): normalize over small "ghost" batches in training.

Each BatchNorm layer is wrapped in a `GhostBatchNorm` that splits the training batch into
chunks of about ``ghost_batch_size`` samples and normalizes each with its own statistics,
which regularizes like training with a small batch. The running statistics receive one
update per chunk, with the momentum divided by the number of chunks so they move as
fast per step as before. In eval the layer is the plain BatchNorm. Applying it twice wraps
no layer twice.

Differs from Composer: a batch no larger than ``ghost_batch_size`` (a short last batch, a
small per-rank batch) is normalized as one ghost batch instead of raising.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.algorithms._surgery import replace_modules
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary

__all__ = ["GhostBatchNorm", "GhostBatchNormConfig", "GhostBatchNormLayer", "apply_ghost_batchnorm"]

_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


@dataclass(kw_only=True)
class GhostBatchNormConfig:
    ghost_batch_size: int = primary(32)
    """Samples per ghost batch (per microbatch on each rank); at least 2."""

    def __post_init__(self) -> None:
        if self.ghost_batch_size < 2:
            raise ValueError(
                f"ghost_batch_size must be >= 2 (batch statistics need two samples), got "
                f"{self.ghost_batch_size}"
            )


class GhostBatchNormLayer(nn.Module):
    """A BatchNorm layer that normalizes each ghost batch separately in training."""

    def __init__(self, batchnorm: nn.modules.batchnorm._BatchNorm, ghost_batch_size: int):
        super().__init__()
        self.batchnorm = batchnorm
        self.ghost_batch_size = ghost_batch_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chunks = math.ceil(x.shape[0] / self.ghost_batch_size)
        if not self.training or chunks <= 1:
            return self.batchnorm(x)
        pieces = x.chunk(chunks)
        momentum = self.batchnorm.momentum
        if momentum is not None:
            self.batchnorm.momentum = momentum / len(pieces)
        try:
            return torch.cat([self.batchnorm(piece) for piece in pieces])
        finally:
            self.batchnorm.momentum = momentum


def apply_ghost_batchnorm(
    model: nn.Module,
    config: GhostBatchNormConfig | None = None,
    /,
    *,
    optimizers: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
    **options: Any,
) -> dict[str, nn.Module]:
    """Wrap every BatchNorm{1,2,3}d of ``model`` in a `GhostBatchNormLayer`.

    Takes a `GhostBatchNormConfig` or its fields as keyword arguments.
    """
    size = build_config(GhostBatchNormConfig, config, options).ghost_batch_size
    done = {id(m.batchnorm) for m in model.modules() if isinstance(m, GhostBatchNormLayer)}

    def unwrapped(module: nn.Module) -> bool:
        return isinstance(module, _BATCHNORMS) and id(module) not in done

    def wrap(module: nn.Module, index: int) -> nn.Module:
        return GhostBatchNormLayer(module, size)  # type: ignore[arg-type]

    return replace_modules(
        model,
        {unwrapped: wrap},
        optimizers=optimizers,
        method="ghost_batchnorm",
    )


class GhostBatchNorm(ComposableAlgorithm, config=GhostBatchNormConfig):
    """Wraps BatchNorm layers at INIT (see `GhostBatchNormConfig`)."""

    config: GhostBatchNormConfig
    required_on_load = True
    required_events = (Event.INIT,)

    def __init__(self, config: GhostBatchNormConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    match_events = frozenset({Event.INIT})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        model = state.parallelism.unwrap(state.model)
        replaced = apply_ghost_batchnorm(model, self.config, optimizers=state.optimizers)
        logger.log_hyperparameters({"ghost_batchnorm/num_replaced": len(replaced)})
