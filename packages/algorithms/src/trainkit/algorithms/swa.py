"""Stochastic weight averaging (Izmailov et al. 2018): end on the average of late weights.

From ``swa_start`` the weights are averaged with equal weight at every ``update_interval``
(epochs or batches, counted from the first update event at or after ``swa_start``, as
Composer). With ``swa_lr`` set, the learning rate of every parameter group anneals from
its value at the first update to ``swa_lr`` over ``anneal_steps`` updates (PyTorch's
``SWALR``, ``"linear"`` or ``"cos"``, which Composer uses) and holds there. At the first
update event at or after ``swa_end`` the model takes the average (parameters; buffers
are the model's own) and the method is done: the annealing stops (the run's schedulers set
the rate again at their next step), and a later ``fit(duration=...)`` trains on from the
average without averaging again.

Batch-norm statistics do not average. When the average comes in at the end of training
(``swa_end="1dur"``, or when training ends before ``swa_end``) or at the end of an
epoch, they are recomputed for it over ``bn_batches`` training batches, as the paper's
``bn_update``; when it comes in mid-epoch, the training that follows refreshes them, as
in Composer (hence Composer's default ``swa_end="0.97dur"``, kept here). The average,
the update counts and the annealing's starting rates are in the checkpoint, so a resumed
run is exact.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State, Time, TimeUnit, ensure_time
from trainkit.core.config import build_config, primary

__all__ = ["SWA", "SWAConfig", "recompute_batchnorm", "swa_learning_rate", "update_average"]

AnnealStrategy = Literal["linear", "cos"]
_WHEN = (TimeUnit.DURATION, TimeUnit.EPOCH, TimeUnit.BATCH)


@dataclass(kw_only=True)
class SWAConfig:
    swa_start: str = primary("0.7dur")
    """When averaging begins: a fraction of training (``"0.7dur"``), epochs or batches."""
    swa_end: str = "0.97dur"
    """When the model takes the average and averaging stops; after ``swa_start``, in its
    unit. ``"1dur"``: at the end of training, with batch-norm statistics recomputed."""
    update_interval: str = "1ep"
    """How often to add the weights to the average, in epochs or batches ('1ep', '10ba')."""
    swa_lr: float | None = None
    """If set, the learning rate anneals to this value from the first update on; positive."""
    anneal_strategy: AnnealStrategy = "linear"
    """How the learning rate goes to ``swa_lr``: ``"linear"`` or ``"cos"`` (as SWALR)."""
    anneal_steps: int = 10
    """Averaging updates over which the learning rate reaches ``swa_lr``; at least 1."""
    bn_batches: int | None = None
    """Training batches used to recompute batch-norm statistics (None: one epoch)."""

    def __post_init__(self) -> None:
        start = ensure_time(self.swa_start, "swa_start")
        end = ensure_time(self.swa_end, "swa_end")
        for name, when in (("swa_start", start), ("swa_end", end)):
            if when.unit not in _WHEN:
                raise ValueError(
                    f"{name} {getattr(self, name)!r} must be a fraction of training, epochs or "
                    "batches, e.g. '0.7dur', '6ep' or '500ba'"
                )
            if when.unit == TimeUnit.DURATION and not 0.0 <= when.value <= 1.0:
                raise ValueError(f"{name} must be within [0dur, 1dur], got {getattr(self, name)!r}")
        if start.unit != end.unit or not start.value < end.value:
            raise ValueError(
                f"swa_end must come after swa_start, in the same unit; got "
                f"swa_start={self.swa_start!r}, swa_end={self.swa_end!r}"
            )
        interval = ensure_time(self.update_interval, "update_interval")
        if interval.unit not in (TimeUnit.EPOCH, TimeUnit.BATCH) or interval.value < 1:
            raise ValueError(
                f"update_interval {self.update_interval!r} must be a positive number of epochs "
                "or batches, e.g. '1ep' or '100ba'"
            )
        if self.swa_lr is not None and not self.swa_lr > 0:
            raise ValueError(f"swa_lr must be positive, got {self.swa_lr}")
        if self.anneal_strategy not in ("linear", "cos"):
            raise ValueError(
                f"anneal_strategy must be 'linear' or 'cos', got {self.anneal_strategy!r}"
            )
        if (
            isinstance(self.anneal_steps, bool)
            or not isinstance(self.anneal_steps, int)
            or (self.anneal_steps < 1)
        ):
            raise ValueError(
                f"anneal_steps must be an int of at least 1, got {self.anneal_steps!r}"
            )
        if self.bn_batches is not None and self.bn_batches < 1:
            raise ValueError(f"bn_batches must be at least 1, got {self.bn_batches}")


def swa_learning_rate(
    initial_lr: float, updates: int, config: SWAConfig | None = None, /, **options: Any
) -> float:
    """The learning rate after ``updates`` averaging updates (SWALR's annealing).

    ``swa_lr * a + initial_lr * (1 - a)`` with ``a = t`` (linear) or ``(1 - cos(pi t)) / 2``
    (cos) and ``t = min(1, updates / anneal_steps)``; fields from the `SWAConfig` or
    keyword arguments (``swa_lr`` must be set).
    """
    cfg = build_config(SWAConfig, config, options)
    if cfg.swa_lr is None:
        raise ValueError("swa_learning_rate needs swa_lr")
    t = min(1.0, updates / cfg.anneal_steps)
    alpha = t if cfg.anneal_strategy == "linear" else (1.0 - math.cos(math.pi * t)) / 2.0
    return cfg.swa_lr * alpha + initial_lr * (1.0 - alpha)


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
    """Averages the weights late in training and ends on the average (see `SWAConfig`).

    Differences from Composer: ``swa_lr`` alone turns the annealing on (Composer needs
    ``schedule_swa_lr=True`` and then anneals to the scheduler's last rate instead of
    ``swa_lr``); the annealing overrides the run's schedulers while it lasts, for every
    optimizer; ``swa_start`` / ``swa_end`` may also be given in batches; the average is kept
    on the model's device; a run that ends before ``swa_end`` still ends on the average;
    batch-norm statistics are recomputed for the average when it comes in at the end of
    training or of an epoch (the paper's ``bn_update``; Composer relies on the training that
    follows ``swa_end`` only).
    """

    config: SWAConfig

    def __init__(self, config: SWAConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        cfg = self.config
        interval = ensure_time(cfg.update_interval, "update_interval")
        self._event = Event.EPOCH_END if interval.unit == TimeUnit.EPOCH else Event.BATCH_END
        self._every = int(interval.value)
        self._start = ensure_time(cfg.swa_start, "swa_start")
        self._end = ensure_time(cfg.swa_end, "swa_end")
        self.average: dict[str, torch.Tensor] | None = None
        self.count = 0
        """Weight sets in the average."""
        self.events = 0
        """Update events seen since ``swa_start`` (an update every ``update_interval``)."""
        self.initial_lrs: list[list[float]] | None = None
        """Each optimizer's group learning rates at the first update (where annealing starts)."""
        self.applied = False
        self.match_events = frozenset({Event.BATCH_START, self._event, Event.FIT_END})

    def match(self, event: Event, state: State) -> bool:
        if self.applied:
            return False
        if event == Event.BATCH_START:
            return self.config.swa_lr is not None and self.initial_lrs is not None
        return event in (self._event, Event.FIT_END)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        model = state.parallelism.unwrap(state.model)
        if event == Event.BATCH_START:
            self._set_learning_rates(state)
        elif event == self._event:
            if not _reached(state, self._start):
                return
            if self.events % self._every == 0:
                self._update(state, model)
                logger.log_metrics({"swa/models_averaged": self.count})
            self.events += 1
            if _reached(state, self._end):
                self._finish(state, model, event)
        elif state.is_done() and self.average is not None:  # ended before swa_end
            self._finish(state, model, event)

    def _update(self, state: State, model: nn.Module) -> None:
        if self.average is None:
            self.average = {n: p.detach().clone() for n, p in model.named_parameters()}
        else:
            update_average(self.average, model, self.count)
        self.count += 1
        if self.initial_lrs is None:
            self.initial_lrs = [[g["lr"] for g in o.param_groups] for o in state.optimizers]

    def _set_learning_rates(self, state: State) -> None:
        assert self.initial_lrs is not None
        for optimizer, initial in zip(state.optimizers, self.initial_lrs, strict=True):
            for group, lr in zip(optimizer.param_groups, initial, strict=True):
                group["lr"] = swa_learning_rate(lr, self.count, self.config)

    def _finish(self, state: State, model: nn.Module, event: Event) -> None:
        assert self.average is not None
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(self.average[name])
        data = state.train_data
        # Reading the training data in the middle of an epoch would disturb the epoch being
        # trained; there, the batches that follow refresh the statistics (as in Composer).
        if data is not None and (state.is_done() or event == Event.EPOCH_END):
            epoch = itertools.islice(data.iter_epoch(state.timestamp.epoch), self.config.bn_batches)
            batches = (data.device_transfer(b, state.device) for b in epoch)
            recompute_batchnorm(model, batches, state.model)
        self.applied = True

    def state_dict(self) -> dict[str, Any]:
        if self.average is None:
            return {}
        return {
            "average": self.average,
            "count": self.count,
            "events": self.events,
            "initial_lrs": self.initial_lrs,
            "applied": self.applied,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.average = state.get("average")
        self.count = state.get("count", 0)
        self.events = state.get("events", 0)
        self.initial_lrs = state.get("initial_lrs")
        self.applied = state.get("applied", False)


def _reached(state: State, when: Time) -> bool:
    if when.unit == TimeUnit.DURATION:
        return state.elapsed_fraction() >= when.value - 1e-12
    return state.timestamp.get(when.unit) >= when.value
