"""Low-precision GroupNorm: compute GroupNorm in bf16/fp16 instead of autocast's fp32.

Autocast runs `group_norm` in fp32, a large share of the memory traffic of a step in
convolutional models built on it (e.g. diffusion U-Nets). `LPGroupNorm` is an
`nn.GroupNorm` (same parameters, same names, so checkpoints and optimizers are
unaffected) whose forward casts input, weight and bias to the low precision. Runs last among surgery methods: it replaces the norms other surgery
left in place.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainkit.algorithms._low_precision import (
    LOW_PRECISION_DTYPES,
    LowPrecisionDtype,
    check_dtype,
    dtype_for,
    run_in_dtype,
)
from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.algorithms._surgery import replace_modules
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary

__all__ = [
    "LPGroupNorm",
    "LowPrecisionGroupNorm",
    "LowPrecisionGroupNormConfig",
    "apply_low_precision_groupnorm",
]


@dataclass(kw_only=True)
class LowPrecisionGroupNormConfig:
    dtype: LowPrecisionDtype | None = primary(None)
    """"bfloat16" or "float16"; None follows the run's precision (amp_bf16 -> bfloat16,
    amp_fp16 -> float16) and does nothing in an fp32 run (`apply_low_precision_groupnorm`,
    which has no run to follow, takes None as "bfloat16")."""

    def __post_init__(self) -> None:
        check_dtype(self.dtype)


class LPGroupNorm(nn.GroupNorm):
    """`nn.GroupNorm` computed in ``low_precision_dtype``."""

    low_precision_dtype: torch.dtype = torch.bfloat16

    @classmethod
    def from_groupnorm(cls, module: nn.GroupNorm, dtype: torch.dtype) -> LPGroupNorm:
        new = cls(module.num_groups, module.num_channels, module.eps, affine=False)
        new.affine = module.affine
        new.weight, new.bias = module.weight, module.bias  # the same Parameters
        new.low_precision_dtype = dtype
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run_in_dtype(
            self.low_precision_dtype,
            F.group_norm,
            x,
            self.num_groups,
            self.weight,
            self.bias,
            self.eps,
        )


def apply_low_precision_groupnorm(
    model: nn.Module,
    config: LowPrecisionGroupNormConfig | None = None,
    /,
    *,
    optimizers: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
    **options: Any,
) -> dict[str, nn.Module]:
    """Replace every `nn.GroupNorm` (not subclasses) with an `LPGroupNorm`.

    Takes a `LowPrecisionGroupNormConfig` or its fields as keyword arguments; without a run
    to follow, ``dtype=None`` means "bfloat16".
    """
    dtype = build_config(LowPrecisionGroupNormConfig, config, options).dtype or "bfloat16"
    low = LOW_PRECISION_DTYPES[dtype]
    return replace_modules(
        model,
        {lambda m: type(m) is nn.GroupNorm: lambda m, i: LPGroupNorm.from_groupnorm(m, low)},
        optimizers=optimizers,
        method="low_precision_groupnorm",
    )


class LowPrecisionGroupNorm(ComposableAlgorithm, config=LowPrecisionGroupNormConfig):
    """Swaps in `LPGroupNorm` at INIT (see `LowPrecisionGroupNormConfig`).

    Runs last (``order = "last"``), to replace the norms other surgery left in place. Not
    ``required_on_load``: `LPGroupNorm` keeps the parameters and their names, so its
    checkpoints load into a model without it.
    """

    config: LowPrecisionGroupNormConfig
    order = "last"
    required_events = (Event.INIT,)

    def __init__(
        self, config: LowPrecisionGroupNormConfig | None = None, /, **options: Any
    ) -> None:
        super().__init__(config, **options)

    match_events = frozenset({Event.INIT})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        low = dtype_for(self.config.dtype, state.precision)
        if low is None:
            warnings.warn(
                "low_precision_groupnorm does nothing in an fp32 run; use precision='amp_bf16' "
                "or give dtype='bfloat16'",
                stacklevel=2,
            )
            return
        model = state.parallelism.unwrap(state.model)
        replaced = apply_low_precision_groupnorm(
            model, self.config, dtype=low, optimizers=state.optimizers
        )
        logger.log_hyperparameters({"low_precision_groupnorm/num_replaced": len(replaced)})
