"""Layer freezing (Brock et al. 2017, FreezeOut): stop training the first layers, progressively.

From ``freeze_start`` (a fraction of training) to the end, the share of frozen layers
grows linearly to ``freeze_level``, earliest layers first, as Composer: the layers are the
model's leaf modules that hold parameters, in depth-first order, and the first
``int(share * (layers - 1))`` are frozen, so the last layer (the head) never is. The
schedule is a function of the run's position, so a resumed run freezes the same layers
again at FIT_START; layers are never unfrozen.

A frozen parameter gets ``requires_grad = False`` and loses its gradient: backward no
longer computes one, and every torch optimizer (and trainkit's decoupled ones) skips a
parameter without a gradient, so no step, momentum or weight decay reaches it again, even
in a loop that zeroes gradients instead of clearing them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary

__all__ = [
    "LayerFreezing",
    "LayerFreezingConfig",
    "freeze_layers",
    "frozen_count",
    "frozen_fraction",
]


@dataclass(kw_only=True)
class LayerFreezingConfig:
    freeze_start: float = primary(0.5)
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
    """Leaf modules that hold parameters, depth first (Composer's ``_get_layers``)."""
    children = list(model.children())
    if not children:
        return [model] if next(model.parameters(), None) is not None else []
    return [layer for child in children for layer in _layers(child)]


def frozen_count(layers: int, fraction: float) -> int:
    """How many of ``layers`` layers a share ``fraction`` freezes: ``int(fraction * (layers - 1))``."""
    return max(0, math.floor(fraction * (layers - 1) + 1e-9))


def freeze_layers(model: nn.Module, fraction: float) -> int:
    """Freeze the first ``int(fraction * (layers - 1))`` layers of ``model`` (never the last);
    returns that count.

    Raises:
        ValueError: the model has no parameters, or ``fraction`` is outside [0, 1].
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    layers = _layers(model)
    if not layers:
        raise ValueError(f"layer_freezing: {type(model).__name__} has no parameters to freeze")
    count = frozen_count(len(layers), fraction)
    for layer in layers[:count]:
        for param in layer.parameters(recurse=False):
            param.requires_grad_(False)
            param.grad = None
    return count


class LayerFreezing(ComposableAlgorithm, config=LayerFreezingConfig):
    """Freezes the earliest layers progressively (see `LayerFreezingConfig`).

    Differences from Composer: Composer also removes frozen parameters from the optimizers'
    groups, which changes the optimizers' saved shape (it warns that such checkpoints cannot
    be resumed reliably); here they stay listed, with their state, so a checkpoint loads
    into a fresh run and the resumed run is exact (they get no update either way). Composer
    re-checks the schedule at each epoch's end; here at each batch's end, so a one-epoch run
    freezes progressively too.
    """

    config: LayerFreezingConfig
    required_events = (Event.FIT_START, Event.BATCH_END)

    def __init__(self, config: LayerFreezingConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self.frozen_layers = 0
        self._layers = 0  # counted at FIT_START, not per batch

    match_events = frozenset({Event.FIT_START, Event.BATCH_END})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        fraction = frozen_fraction(state.elapsed_fraction(), self.config)
        model = state.parallelism.unwrap(state.model)
        if event == Event.FIT_START:
            self._layers = len(_layers(model))
        count = frozen_count(self._layers, fraction)
        if count > self.frozen_layers or (event == Event.FIT_START and count):
            self.frozen_layers = freeze_layers(model, fraction)
            logger.log_metrics({"layer_freezing/frozen_layers": self.frozen_layers})
