"""Weight standardization (Qiao et al. 2019): convolutions use zero-mean, unit-variance filters.

Each convolution's weight becomes a `torch.nn.utils.parametrize` parametrization of the
stored one: every forward reads ``(w - mean(w)) / std(w)`` per output channel, and
gradients flow through the standardization. The stored tensor stays the same `Parameter`
(now at ``<conv>.parametrizations.weight.original``), so optimizers need no re-binding.
Usually paired with GroupNorm, where it stands in for what BatchNorm did to conditioning.

Differs from Composer: "the last layers" that ``n_last_layers_ignore`` leaves alone are the
last convolutions in module order (``model.named_modules()``); Composer orders them by an
``torch.fx`` trace of the forward pass when the model can be traced. The two agree on
torchvision's ResNets, whose modules are registered in the order they run.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.algorithms._surgery import check_surgery_allowed
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary

__all__ = [
    "WeightStandardization",
    "WeightStandardizationConfig",
    "apply_weight_standardization",
    "standardize_weight",
]

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


@dataclass(kw_only=True)
class WeightStandardizationConfig:
    n_last_layers_ignore: int = primary(0)
    """Leave the last this many convolutions (in module order) as they are, e.g. a
    convolutional classifier head."""

    def __post_init__(self) -> None:
        if self.n_last_layers_ignore < 0:
            raise ValueError(f"n_last_layers_ignore must be >= 0, got {self.n_last_layers_ignore}")


def standardize_weight(weight: torch.Tensor, eps: float = 1e-10) -> torch.Tensor:
    """Zero mean and unit (biased) variance over all dims but the first."""
    dims = tuple(range(1, weight.ndim))
    var, mean = torch.var_mean(weight, dim=dims, keepdim=True, unbiased=False)
    return (weight - mean) / torch.sqrt(var + eps)


class _Standardize(nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return standardize_weight(weight)


def apply_weight_standardization(
    model: nn.Module,
    config: WeightStandardizationConfig | None = None,
    /,
    *,
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
    **options: Any,
) -> list[str]:
    """Standardize the weights of ``model``'s convolutions; returns their names.

    Takes a `WeightStandardizationConfig` or its fields as keyword arguments.
    """
    n_last_layers_ignore = build_config(
        WeightStandardizationConfig, config, options
    ).n_last_layers_ignore
    optimizers = [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else optimizers
    check_surgery_allowed(optimizers or [], "weight_standardization")
    convs = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, _CONVS) and not parametrize.is_parametrized(m, "weight")
    ]
    chosen = convs[: len(convs) - n_last_layers_ignore]
    if not chosen:
        warnings.warn(
            f"weight_standardization matched no convolution in {type(model).__name__} "
            f"({len(convs)} found, n_last_layers_ignore={n_last_layers_ignore}); it has no "
            "effect on this model",
            stacklevel=2,
        )
    for _, conv in chosen:
        parametrize.register_parametrization(conv, "weight", _Standardize())
    return [name for name, _ in chosen]


class WeightStandardization(ComposableAlgorithm, config=WeightStandardizationConfig):
    """Standardizes convolution weights from INIT on (see `WeightStandardizationConfig`)."""

    config: WeightStandardizationConfig
    required_on_load = True
    required_events = (Event.INIT,)

    def __init__(
        self, config: WeightStandardizationConfig | None = None, /, **options: Any
    ) -> None:
        super().__init__(config, **options)

    match_events = frozenset({Event.INIT})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        model = state.parallelism.unwrap(state.model)
        names = apply_weight_standardization(model, self.config, optimizers=state.optimizers)
        logger.log_hyperparameters({"weight_standardization/num_replaced": len(names)})
