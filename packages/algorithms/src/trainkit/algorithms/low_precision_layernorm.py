"""Low-precision LayerNorm: compute LayerNorm in bf16/fp16 instead of autocast's fp32.

Autocast runs `layer_norm` in fp32; in transformers that is a large share of the step's
memory traffic. `LPLayerNorm` is an `nn.LayerNorm` (same parameters, same names, so
checkpoints and optimizers are unaffected) whose forward casts input, weight and bias to
the low precision. Runs last among surgery methods: it replaces the norms other surgery
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
    "LPLayerNorm",
    "LowPrecisionLayerNorm",
    "LowPrecisionLayerNormConfig",
    "apply_low_precision_layernorm",
]


@dataclass(kw_only=True)
class LowPrecisionLayerNormConfig:
    dtype: LowPrecisionDtype | None = primary(None)
    """"bfloat16" or "float16"; None follows the run's precision (amp_bf16 -> bfloat16,
    amp_fp16 -> float16) and does nothing in an fp32 run (`apply_low_precision_layernorm`,
    which has no run to follow, takes None as "bfloat16")."""

    def __post_init__(self) -> None:
        check_dtype(self.dtype)


class LPLayerNorm(nn.LayerNorm):
    """`nn.LayerNorm` computed in ``low_precision_dtype``."""

    low_precision_dtype: torch.dtype = torch.bfloat16

    @classmethod
    def from_layernorm(cls, module: nn.LayerNorm, dtype: torch.dtype) -> LPLayerNorm:
        new = cls(module.normalized_shape, module.eps, elementwise_affine=False, bias=False)
        new.elementwise_affine = module.elementwise_affine
        new.weight, new.bias = module.weight, module.bias  # the same Parameters
        new.low_precision_dtype = dtype
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run_in_dtype(
            self.low_precision_dtype,
            F.layer_norm,
            x,
            self.normalized_shape,
            self.weight,
            self.bias,
            self.eps,
        )


def apply_low_precision_layernorm(
    model: nn.Module,
    config: LowPrecisionLayerNormConfig | None = None,
    /,
    *,
    optimizers: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
    **options: Any,
) -> dict[str, nn.Module]:
    """Replace every `nn.LayerNorm` (not subclasses) with an `LPLayerNorm`.

    Takes a `LowPrecisionLayerNormConfig` or its fields as keyword arguments; without a run
    to follow, ``dtype=None`` means "bfloat16".
    """
    dtype = build_config(LowPrecisionLayerNormConfig, config, options).dtype or "bfloat16"
    low = LOW_PRECISION_DTYPES[dtype]
    return replace_modules(
        model,
        {lambda m: type(m) is nn.LayerNorm: lambda m, i: LPLayerNorm.from_layernorm(m, low)},
        optimizers=optimizers,
        method="low_precision_layernorm",
    )


class LowPrecisionLayerNorm(ComposableAlgorithm, config=LowPrecisionLayerNormConfig):
    """Swaps in `LPLayerNorm` at INIT (see `LowPrecisionLayerNormConfig`).

    Runs last (``order = "last"``), to replace the norms other surgery left in place. Not
    ``required_on_load``: `LPLayerNorm` keeps the parameters and their names, so its
    checkpoints load into a model without it.
    """

    config: LowPrecisionLayerNormConfig
    order = "last"
    required_events = (Event.INIT,)

    def __init__(
        self, config: LowPrecisionLayerNormConfig | None = None, /, **options: Any
    ) -> None:
        super().__init__(config, **options)

    match_events = frozenset({Event.INIT})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        low = dtype_for(self.config.dtype, state.precision)
        if low is None:
            warnings.warn(
                "low_precision_layernorm does nothing in an fp32 run; use precision='amp_bf16' "
                "or give dtype='bfloat16'",
                stacklevel=2,
            )
            return
        model = state.parallelism.unwrap(state.model)
        replaced = apply_low_precision_layernorm(
            model, self.config, dtype=low, optimizers=state.optimizers
        )
        logger.log_hyperparameters({"low_precision_layernorm/num_replaced": len(replaced)})
