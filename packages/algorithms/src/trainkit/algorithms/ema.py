"""Exponential moving average of the weights (Polyak averaging).

The average is updated after every ``update_interval``; evaluation runs on it; at the end
of ``fit`` the model holds it (so the final checkpoint and export are the averaged model)
while the training weights wait in the algorithm's state, swapped back when training
continues. Both sets are in the checkpoint, so a resumed run is exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State, Time, TimeUnit, ensure_time

__all__ = ["EMA", "EMAConfig", "compute_ema"]


@dataclass(kw_only=True)
class EMAConfig:
    half_life: str = "1000ba"
    """After this long, the weight of older values in the average has halved (in batches)."""
    update_interval: str = "1ba"
    """How often to update the average (in batches)."""

    def __post_init__(self) -> None:
        for name in ("half_life", "update_interval"):
            value = ensure_time(getattr(self, name), name)
            if value.unit != TimeUnit.BATCH or value.value <= 0:
                raise ValueError(
                    f"{name} {getattr(self, name)!r} must be a positive number of batches, e.g. '1000ba'"
                )

    @property
    def smoothing(self) -> float:
        """Weight of the old average at each update."""
        half_life = Time.from_timestring(self.half_life).value
        interval = Time.from_timestring(self.update_interval).value
        return 0.5 ** (interval / half_life)


@torch.no_grad()
def compute_ema(model: nn.Module, average: dict[str, torch.Tensor], smoothing: float) -> None:
    """``average = smoothing * average + (1 - smoothing) * weights``, for every float tensor."""
    for name, tensor in _float_state(model).items():
        average[name].lerp_(tensor.detach(), 1.0 - smoothing)


def _float_state(model: nn.Module) -> dict[str, torch.Tensor]:
    named = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    return {name: t for name, t in named.items() if t.is_floating_point()}


class EMA(ComposableAlgorithm, config=EMAConfig):
    """Keeps an exponential moving average of the model's weights (see `EMAConfig`)."""

    config: EMAConfig
    required_events = (Event.FIT_START, Event.BATCH_END)

    def __init__(self, config: EMAConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self.average: dict[str, torch.Tensor] | None = None
        self.stash: dict[str, torch.Tensor] | None = None  # training weights while swapped out
        self._interval = Time.from_timestring(self.config.update_interval).value
        self._smoothing = self.config.smoothing  # parsed once, not per batch
        self._swapped_for_eval = False

    def match(self, event: Event, state: State) -> bool:
        return event in (
            Event.FIT_START,
            Event.BATCH_END,
            Event.EVAL_BEFORE_ALL,
            Event.EVAL_AFTER_ALL,
            Event.FIT_END,
        )

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        model = state.parallelism.unwrap(state.model)
        if event == Event.FIT_START:
            if self.stash is not None:  # continuing after a fit that ended on the average
                self._swap(model)
            if self.average is None:
                self.average = {n: t.detach().clone() for n, t in _float_state(model).items()}
        elif self.average is None:
            return
        elif event == Event.BATCH_END:
            if state.timestamp.batch % self._interval == 0:
                compute_ema(model, self.average, self._smoothing)
        elif event == Event.EVAL_BEFORE_ALL and self.stash is None:
            self._swap(model)
            self._swapped_for_eval = True
        elif event == Event.EVAL_AFTER_ALL and self._swapped_for_eval:
            self._swap(model)
            self._swapped_for_eval = False
        elif event == Event.FIT_END and self.stash is None:
            self._swap(model)

    @torch.no_grad()
    def _swap(self, model: nn.Module) -> None:
        """Put the average into the model and keep the training weights, or the reverse."""
        live = _float_state(model)
        if self.stash is None:
            assert self.average is not None
            self.stash = {n: t.detach().clone() for n, t in live.items()}
            for name, tensor in live.items():
                tensor.copy_(self.average[name])
        else:
            for name, tensor in live.items():
                tensor.copy_(self.stash[name])
            self.stash = None

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        if self.average is not None:
            state["average"] = self.average
        if self.stash is not None:
            state["stash"] = self.stash
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.average = state.get("average")
        self.stash = state.get("stash")
