"""Learning-rate schedules that speak `Time`.

A schedule is a callable ``(state) -> float``: the multiplier applied to each parameter
group's initial learning rate at the current point of training. The Trainer steps them
after every optimizer step. Times may be given in any unit the run can convert to a
fraction of ``max_duration`` (``"0.1dur"``, ``"2ep"``, ``"500ba"``, ...); torch's own LR
schedulers are accepted too and are also stepped every batch.

    LinearWithWarmupScheduler(t_warmup="0.1dur", alpha_f=0.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from trainkit.core._time import Time, TimeUnit, ensure_time

if TYPE_CHECKING:
    from trainkit.core._state import State

__all__ = [
    "ConstantScheduler",
    "CosineAnnealingScheduler",
    "CosineAnnealingWithWarmupScheduler",
    "ExponentialScheduler",
    "LinearScheduler",
    "LinearWithWarmupScheduler",
    "MultiStepScheduler",
    "PolynomialScheduler",
    "Scheduler",
    "StepScheduler",
    "as_fraction",
]


@runtime_checkable
class Scheduler(Protocol):
    def __call__(self, state: State) -> float: ...


def as_fraction(time: Time | str | int, state: State) -> float:
    """``time`` as a fraction of ``state.max_duration`` (``"0.1dur"`` -> 0.1).

    Raises:
        ValueError: the two are in units that cannot be converted (e.g. samples vs epochs).
    """
    time = ensure_time(time, "scheduler time")
    if time.unit == TimeUnit.DURATION:
        return float(time.value)
    max_duration = state.max_duration
    if max_duration is None:
        raise ValueError(f"scheduler time {time} needs the run's max_duration to be set")
    if time.unit == max_duration.unit:
        return time.value / max_duration.value
    batches_per_epoch = state.dataloader_len
    if batches_per_epoch is not None:
        if time.unit == TimeUnit.EPOCH and max_duration.unit == TimeUnit.BATCH:
            return time.value * batches_per_epoch / max_duration.value
        if time.unit == TimeUnit.BATCH and max_duration.unit == TimeUnit.EPOCH:
            return time.value / (max_duration.value * batches_per_epoch)
    raise ValueError(
        f"scheduler time {time} cannot be converted to the unit of max_duration "
        f"{max_duration}; give it as a fraction ('0.1dur') or in {max_duration.unit.value}"
    )


def _positive_time(name: str, value: Time | str | int) -> Time:
    time = ensure_time(value, name)
    if time.value == 0:
        raise ValueError(
            f"{name} {value!r} is zero; use a positive duration such as '1dur' or '1ep'"
        )
    return time


def _check_alpha(name: str, value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative number, got {value!r}")


class ConstantScheduler:
    """``alpha`` until ``t_max``, then 1.0."""

    def __init__(self, alpha: float = 1.0, t_max: Time | str = "1dur"):
        _check_alpha("alpha", alpha)
        self.alpha, self.t_max = alpha, ensure_time(t_max, "t_max")

    def __call__(self, state: State) -> float:
        return self.alpha if state.elapsed_fraction() < as_fraction(self.t_max, state) else 1.0


class LinearScheduler:
    """Linear from ``alpha_i`` to ``alpha_f`` over ``t_max``, then ``alpha_f``."""

    def __init__(self, alpha_i: float = 1.0, alpha_f: float = 0.0, t_max: Time | str = "1dur"):
        _check_alpha("alpha_i", alpha_i)
        _check_alpha("alpha_f", alpha_f)
        self.alpha_i, self.alpha_f = alpha_i, alpha_f
        self.t_max = _positive_time("t_max", t_max)

    def __call__(self, state: State) -> float:
        progress = min(state.elapsed_fraction() / as_fraction(self.t_max, state), 1.0)
        return self.alpha_i + (self.alpha_f - self.alpha_i) * progress


class ExponentialScheduler:
    """``gamma ** (elapsed / decay_period)``."""

    def __init__(self, gamma: float, decay_period: Time | str = "1ep"):
        _check_alpha("gamma", gamma)
        self.gamma, self.decay_period = gamma, _positive_time("decay_period", decay_period)

    def __call__(self, state: State) -> float:
        return self.gamma ** (state.elapsed_fraction() / as_fraction(self.decay_period, state))


class StepScheduler:
    """Multiply by ``gamma`` every ``step_size``."""

    def __init__(self, step_size: Time | str, gamma: float = 0.1):
        _check_alpha("gamma", gamma)
        self.step_size, self.gamma = _positive_time("step_size", step_size), gamma

    def __call__(self, state: State) -> float:
        steps = math.floor(state.elapsed_fraction() / as_fraction(self.step_size, state) + 1e-9)
        return self.gamma**steps


class MultiStepScheduler:
    """Multiply by ``gamma`` at each milestone, e.g. ``milestones=["0.3dur", "0.6dur"]``."""

    def __init__(self, milestones: Sequence[Time | str], gamma: float = 0.1):
        _check_alpha("gamma", gamma)
        self.milestones = [ensure_time(m, "milestone") for m in milestones]
        self.gamma = gamma

    def __call__(self, state: State) -> float:
        elapsed = state.elapsed_fraction() + 1e-9
        passed = sum(1 for m in self.milestones if elapsed >= as_fraction(m, state))
        return self.gamma**passed


class PolynomialScheduler:
    """``alpha_f + (1 - alpha_f) * (1 - progress) ** power`` over ``t_max``."""

    def __init__(self, power: float, t_max: Time | str = "1dur", alpha_f: float = 0.0):
        _check_alpha("alpha_f", alpha_f)
        self.power, self.t_max, self.alpha_f = power, _positive_time("t_max", t_max), alpha_f

    def __call__(self, state: State) -> float:
        progress = min(state.elapsed_fraction() / as_fraction(self.t_max, state), 1.0)
        return self.alpha_f + (1 - self.alpha_f) * (1 - progress) ** self.power


class CosineAnnealingScheduler:
    """Half a cosine from 1 to ``alpha_f`` over ``t_max``."""

    def __init__(self, t_max: Time | str = "1dur", alpha_f: float = 0.0):
        _check_alpha("alpha_f", alpha_f)
        self.t_max, self.alpha_f = _positive_time("t_max", t_max), alpha_f

    def __call__(self, state: State) -> float:
        progress = min(state.elapsed_fraction() / as_fraction(self.t_max, state), 1.0)
        return _cosine(progress, self.alpha_f)


def _cosine(progress: float, alpha_f: float) -> float:
    return alpha_f + (1 - alpha_f) * 0.5 * (1 + math.cos(math.pi * progress))


class _Warmup:
    """Linear warm-up from 0 to 1 over ``t_warmup``, then ``after(progress)`` on the rest."""

    def __init__(self, t_warmup: Time | str, t_max: Time | str, alpha_f: float):
        _check_alpha("alpha_f", alpha_f)
        self.t_warmup, self.t_max = ensure_time(t_warmup, "t_warmup"), ensure_time(t_max, "t_max")
        self.alpha_f = alpha_f

    def _after(self, progress: float) -> float:
        raise NotImplementedError

    def __call__(self, state: State) -> float:
        elapsed = state.elapsed_fraction()
        warmup, total = as_fraction(self.t_warmup, state), as_fraction(self.t_max, state)
        if warmup > total:
            raise ValueError(f"t_warmup {self.t_warmup} is longer than t_max {self.t_max}")
        if elapsed < warmup:
            return elapsed / warmup
        if total == warmup:
            return self.alpha_f
        return self._after(min((elapsed - warmup) / (total - warmup), 1.0))


class LinearWithWarmupScheduler(_Warmup):
    """Warm up linearly over ``t_warmup``, then decay linearly from 1 to ``alpha_f``."""

    def __init__(self, t_warmup: Time | str, alpha_f: float = 0.0, t_max: Time | str = "1dur"):
        super().__init__(t_warmup, t_max, alpha_f)

    def _after(self, progress: float) -> float:
        return 1 + (self.alpha_f - 1) * progress


class CosineAnnealingWithWarmupScheduler(_Warmup):
    """Warm up linearly over ``t_warmup``, then half a cosine from 1 to ``alpha_f``."""

    def __init__(self, t_warmup: Time | str, alpha_f: float = 0.0, t_max: Time | str = "1dur"):
        super().__init__(t_warmup, t_max, alpha_f)

    def _after(self, progress: float) -> float:
        return _cosine(progress, self.alpha_f)
