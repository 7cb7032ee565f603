"""Stochastic weight averaging (Izmailov et al. 2018): end on the average of late weights.

From ``swa_start`` (a fraction of training) the weights are averaged with equal weight
every ``update_interval`` (epochs or batches), optionally at a constant ``swa_lr``. When
training reaches ``max_duration`` the model takes the average, and batch-norm statistics,
which do not average, are recomputed for it over the training data. The average is in
the checkpoint, so a resumed run is exact. Once the average is in the model the method is
done: a later ``fit(duration=...)`` trains on from it without averaging again.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State, TimeUnit, ensure_time

__all__ = ["SWA", "SWAConfig", "recompute_batchnorm", "update_average"]


@dataclass(kw_only=True)
class SWAConfig:
    swa_start: float = 0.7
    """Fraction of training after which weights are averaged; in [0, 1)."""
    update_interval: str = "1ep"
    """How often to add the weights to the average, in epochs or batches ('1ep', '10ba')."""
    swa_lr: float | None = None
    """If set, the learning rate of every optimizer from ``swa_start`` on; positive."""
    bn_batches: int | None = None
    """Training batches used to recompute batch-norm statistics (None: one epoch)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.swa_start < 1.0:
            raise ValueError(f"swa_start must be in [0, 1), got {self.swa_start}")
        interval = ensure_time(self.update_interval, "update_interval")
        if interval.unit not in (TimeUnit.EPOCH, TimeUnit.BATCH) or interval.value < 1:
            raise ValueError(
                f"update_interval {self.update_interval!r} must be a positive number of epochs "
                "or batches, e.g. '1ep' or '100ba'"
            )
        if self.swa_lr is not None and not self.swa_lr > 0:
            raise ValueError(f"swa_lr must be positive, got {self.swa_lr}")
        if self.bn_batches is not None and self.bn_batches < 1:
            raise ValueError(f"bn_batches must be at least 1, got {self.bn_batches}")


@torch.no_grad()
def update_average(average: dict[str, torch.Tensor], model: nn.Module, count: int) -> None:
    """Fold the model's parameters into ``average``, which holds the mean of ``count`` sets."""
    for name, param in model.named_parameters():
        average[name].lerp_(param.detach(), 1.0 / (count + 1))


@torch.no_grad()
def recompute_batchnorm(model: nn.Module, batches: Any, forward: Any = None) -> int:
    """Reset batch-norm statistics and re-estimate them as the mean over ``batches``.

    ``forward(batch)`` runs the model (default ``model(batch)``). Returns how many
    batch-norm modules were updated (0: nothing to do, ``batches`` is not read).
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return 0
    momenta = {m: m.momentum for m in norms}
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average over the batches
    was_training = model.training
    model.train()
    for batch in batches:
        (forward or model)(batch)
    model.train(was_training)
    for norm, momentum in momenta.items():
        norm.momentum = momentum
    return len(norms)


class SWA(ComposableAlgorithm, config=SWAConfig):
    """Averages the weights late in training and ends on the average (see `SWAConfig`)."""

    config: SWAConfig

    def __init__(self, config: SWAConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        interval = ensure_time(self.config.update_interval, "update_interval")
        self._event = Event.EPOCH_END if interval.unit == TimeUnit.EPOCH else Event.BATCH_END
        self._interval = interval
        self.average: dict[str, torch.Tensor] | None = None
        self.count = 0
        self.applied = False

    def match(self, event: Event, state: State) -> bool:
        if self.applied:
            return False
        return event in (self._event, Event.FIT_END) or (
            event == Event.BATCH_START and self.config.swa_lr is not None
        )

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        in_phase = state.elapsed_fraction() >= self.config.swa_start
        model = state.parallelism.unwrap(state.model)
        if event == Event.BATCH_START:
            if in_phase:
                for optimizer in state.optimizers:
                    for group in optimizer.param_groups:
                        group["lr"] = self.config.swa_lr
        elif event == self._event:
            if in_phase and state.timestamp.get(self._interval.unit) % self._interval.value == 0:
                if self.average is None:
                    self.average = {n: p.detach().clone() for n, p in model.named_parameters()}
                else:
                    update_average(self.average, model, self.count)
                self.count += 1
        elif event == Event.FIT_END and state.is_done() and self.average is not None:
            self._finish(state, model)

    def _finish(self, state: State, model: nn.Module) -> None:
        assert self.average is not None
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(self.average[name])
        data = state.train_data
        if data is not None:
            epoch = itertools.islice(data.iter_epoch(state.timestamp.epoch), self.config.bn_batches)
            batches = (data.device_transfer(b, state.device) for b in epoch)
            recompute_batchnorm(model, batches, state.model)
        self.applied = True

    def state_dict(self) -> dict[str, Any]:
        if self.average is None:
            return {}
        return {"average": self.average, "count": self.count, "applied": self.applied}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.average = state.get("average")
        self.count = state.get("count", 0)
        self.applied = state.get("applied", False)
