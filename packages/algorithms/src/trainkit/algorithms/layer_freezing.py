"""Layer freezing (Brock et al. 2017, FreezeOut): stop training the first layers, progressively.

From ``freeze_start`` (a fraction of training) to the end, the share of frozen layers
grows linearly to ``freeze_level``, earliest layers first. Frozen parameters get
``requires_grad = False``: backward no longer computes their gradients and optimizers skip
them. The schedule is a function of the run's position, so a resumed run freezes the same
layers again at FIT_START; layers are never unfrozen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config

__all__ = ["LayerFreezing", "LayerFreezingConfig", "freeze_layers", "frozen_fraction"]


@dataclass(kw_only=True)
class LayerFreezingConfig:
    freeze_start: float = 0.5
    """Fraction of training after which freezing begins; in [0, 1)."""
    freeze_level: float = 1.0
    """Fraction of the layers frozen at the end of training; in (0, 1]."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.freeze_start < 1.0:
            raise ValueError(f"freeze_start must be in [0, 1), got {self.freeze_start}")
        if not 0.0 < self.freeze_level <= 1.0:
            raise ValueError(f"freeze_level must be in (0, 1], got {self.freeze_level}")


def frozen_fraction(
    elapsed: float, config: LayerFreezingConfig | None = None, /, **options: Any
) -> float:
    """Share of the layers frozen once ``elapsed`` (0 to 1) of training is done.

    Takes a `LayerFreezingConfig` or its fields as keyword arguments.
    """
    cfg = build_config(LayerFreezingConfig, config, options)
    if elapsed <= cfg.freeze_start:
        return 0.0
    return cfg.freeze_level * min((elapsed - cfg.freeze_start) / (1.0 - cfg.freeze_start), 1.0)


def _layers(model: nn.Module) -> list[nn.Module]:
    # A layer is a module that owns parameters, in definition order.
    return [m for m in model.modules() if next(m.parameters(recurse=False), None) is not None]


def freeze_layers(model: nn.Module, fraction: float) -> int:
    """Freeze the first ``floor(fraction * layers)`` layers of ``model``; returns that count.

    Raises:
        ValueError: the model has no parameters, or ``fraction`` is outside [0, 1].
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    layers = _layers(model)
    if not layers:
        raise ValueError(f"layer_freezing: {type(model).__name__} has no parameters to freeze")
    count = math.floor(fraction * len(layers) + 1e-9)
    for layer in layers[:count]:
        for param in layer.parameters(recurse=False):
            param.requires_grad_(False)
            param.grad = None
    return count


class LayerFreezing(ComposableAlgorithm, config=LayerFreezingConfig):
    """Freezes the earliest layers progressively (see `LayerFreezingConfig`)."""

    config: LayerFreezingConfig

    def __init__(self, config: LayerFreezingConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self.frozen_layers = 0

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.FIT_START, Event.BATCH_END)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        fraction = frozen_fraction(state.elapsed_fraction(), self.config)
        model = state.parallelism.unwrap(state.model)
        count = math.floor(fraction * len(_layers(model)) + 1e-9)
        if count > self.frozen_layers or (event == Event.FIT_START and count):
            self.frozen_layers = freeze_layers(model, fraction)
            logger.log_metrics({"layer_freezing/frozen_layers": self.frozen_layers})
