"""Exponential moving average of the weights (Polyak averaging).

After every ``update_interval`` batches, ``average = s * average + (1 - s) * weights`` for
every float parameter and buffer, with ``s = 0.5 ** (update_interval / half_life)`` (as
Composer). The model and the algorithm exchange the two sets, as Composer does: the model
holds the average during evaluation and at every checkpoint event (BATCH_, EPOCH_ and
ITERATION_CHECKPOINT), so a checkpoint's model is the averaged model while the training
weights wait in the algorithm's state; the training weights come back before the next
epoch or batch begins (and at FIT_START after loading such a checkpoint), so a resumed run
is exact.

The exchange swaps the tensors' storages (no copy) for ordinary parameters and buffers,
and copies the values for DTensor shards and views, so doing it at every checkpoint event
costs next to nothing outside FSDP (on CPU, 0.1 ms for 10.5M parameters, against 13 ms for
one average update).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State, Time, TimeUnit, ensure_time
from trainkit.core.config import primary

__all__ = ["EMA", "EMAConfig", "compute_ema"]


@dataclass(kw_only=True)
class EMAConfig:
    half_life: str = primary("1000ba")
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
    """Keeps an exponential moving average of the model's weights (see `EMAConfig`).

    Differences from Composer: the model also ends ``fit`` holding the average (so the final
    export is the averaged model; a later ``fit`` swaps the training weights back first);
    Composer swaps at a checkpoint event only when its checkpointer saves there, which an
    algorithm here cannot know, so the exchange happens at every checkpoint event;
    ``half_life`` is in batches only, and averaging starts at the first batch (Composer also
    offers ``ema_start`` and epoch units).
    """

    config: EMAConfig
    required_events = (Event.FIT_START, Event.BATCH_END)

    def __init__(self, config: EMAConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self.held: dict[str, torch.Tensor] | None = None
        """The weights not in the model: the average while the model trains, the training
        weights while the model holds the average."""
        self.average_in_model = False
        self._interval = Time.from_timestring(self.config.update_interval).value
        self._smoothing = self.config.smoothing  # parsed once, not per batch
        self._swapped_for_eval = False
        self._model: nn.Module | None = None
        self.match_events = _EVENTS

    @property
    def average(self) -> dict[str, torch.Tensor] | None:
        """The averaged tensors by name (the model's own while it holds them)."""
        if self.held is None or not self.average_in_model:
            return self.held
        model = self._model
        return _float_state(model) if model is not None else None

    def match(self, event: Event, state: State) -> bool:
        return event in _EVENTS

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        model = state.parallelism.unwrap(state.model)
        self._model = model
        if event == Event.FIT_START and self.held is None:
            self.held = {n: t.detach().clone() for n, t in _float_state(model).items()}
            return
        if self.held is None:
            return
        if event in _TRAINING:
            if self.average_in_model and not self._swapped_for_eval:
                self._swap(model)  # the training weights are back for the step
            if event == Event.BATCH_END and state.timestamp.batch % self._interval == 0:
                compute_ema(model, self.held, self._smoothing)
        elif event in (Event.EVAL_BEFORE_ALL, Event.EVAL_STANDALONE_START):
            if not self.average_in_model:
                self._swap(model)
                self._swapped_for_eval = True
        elif event in (Event.EVAL_AFTER_ALL, Event.EVAL_STANDALONE_END):
            if self._swapped_for_eval:
                self._swap(model)
                self._swapped_for_eval = False
        elif not self.average_in_model:  # checkpoint events and FIT_END
            self._swap(model)

    @torch.no_grad()
    def _swap(self, model: nn.Module) -> None:
        """Exchange the model's weights with the held ones."""
        assert self.held is not None
        for name, tensor in _float_state(model).items():
            other = self.held[name]
            if _by_pointer(tensor, other):
                # O(1): the tensor objects stay (optimizer state, hooks); their storages swap.
                self.held[name] = tensor.data
                tensor.data = other
            else:  # DTensor shards, views: exchange the values
                kept = tensor.detach().clone()
                tensor.copy_(other)
                other.copy_(kept)
        self.average_in_model = not self.average_in_model

    def state_dict(self) -> dict[str, Any]:
        if self.held is None:
            return {}
        return {"held": self.held, "average_in_model": self.average_in_model}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "average" in state:  # saved before the swap-based format
            stash = state.get("stash")
            self.held = stash if stash is not None else state["average"]
            self.average_in_model = stash is not None
        else:
            self.held = state.get("held")
            self.average_in_model = state.get("average_in_model", False)
        self._swapped_for_eval = False


def _by_pointer(tensor: torch.Tensor, other: torch.Tensor) -> bool:
    return (
        type(tensor) in (torch.Tensor, nn.Parameter)
        and type(other) is torch.Tensor
        and tensor._base is None
        and other._base is None
        and tensor.dtype == other.dtype
        and tensor.device == other.device
        and tensor.shape == other.shape
    )


# The training weights must be in the model from the first event of an epoch or a batch on
# (a method at BATCH_START, such as selective backprop's scoring pass, uses them).
_TRAINING = frozenset(
    {
        Event.FIT_START,
        Event.EPOCH_START,
        Event.BEFORE_DATALOADER,
        Event.BATCH_START,
        Event.BATCH_END,
    }
)
_EVENTS = _TRAINING | {
    Event.EVAL_BEFORE_ALL,
    Event.EVAL_AFTER_ALL,
    Event.EVAL_STANDALONE_START,  # Trainer.eval(), as Composer
    Event.EVAL_STANDALONE_END,
    Event.BATCH_CHECKPOINT,
    Event.EPOCH_CHECKPOINT,
    Event.ITERATION_CHECKPOINT,
    Event.FIT_END,
}
