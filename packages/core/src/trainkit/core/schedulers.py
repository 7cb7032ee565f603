"""Learning-rate schedules that speak `Time`.

A schedule is a callable ``(state) -> float``: the multiplier applied to each parameter
group's initial learning rate at the current point of training. The Trainer steps them
after every optimizer step. Times may be given in any unit the run can convert to a
fraction of ``max_duration`` (``"0.1dur"``, ``"2ep"``, ``"500ba"``, ...); torch's own LR
schedulers are accepted too and are also stepped every batch.

Each schedule is a component: its options are one config dataclass (``XSchedulerConfig``,
a docstring per field), and keyword arguments build it::

    LinearWithWarmupScheduler(t_warmup="0.1dur", alpha_f=0.0)
    LinearWithWarmupScheduler(LinearWithWarmupSchedulerConfig(t_warmup="0.1dur"))

They are registered in the ``trainkit.schedulers`` entry-point group (``constant``,
``linear``, ``linear_with_warmup``, ``cosine``, ``cosine_with_warmup``, ``multistep``,
``exponential``, ``polynomial``, ``step``), which is how a config file names them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from trainkit.core._time import Time, TimeUnit, ensure_time
from trainkit.core.config import Configurable

if TYPE_CHECKING:
    from trainkit.core._state import State

__all__ = [
    "ConstantScheduler",
    "ConstantSchedulerConfig",
    "CosineAnnealingScheduler",
    "CosineAnnealingSchedulerConfig",
    "CosineAnnealingWithWarmupScheduler",
    "CosineAnnealingWithWarmupSchedulerConfig",
    "ExponentialScheduler",
    "ExponentialSchedulerConfig",
    "LinearScheduler",
    "LinearSchedulerConfig",
    "LinearWithWarmupScheduler",
    "LinearWithWarmupSchedulerConfig",
    "MultiStepScheduler",
    "MultiStepSchedulerConfig",
    "PolynomialScheduler",
    "PolynomialSchedulerConfig",
    "Scheduler",
    "StepScheduler",
    "StepSchedulerConfig",
    "as_fraction",
]


@runtime_checkable
class Scheduler(Protocol):
    """A schedule: the learning-rate multiplier at the current point of ``state``."""

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
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative number, got {value!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# --- the schedules: a config dataclass each, validated once in __post_init__ ---------------


@dataclass(kw_only=True)
class ConstantSchedulerConfig:
    alpha: float = 1.0
    """The learning-rate multiplier until ``t_max`` (then 1.0)."""
    t_max: Time | str | int = "1dur"
    """How long ``alpha`` holds: ``"1dur"`` (the whole run), ``"2ep"``, ``"500ba"``, ..."""

    def __post_init__(self) -> None:
        _check_alpha("alpha", self.alpha)
        ensure_time(self.t_max, "t_max")


class ConstantScheduler(Configurable, config=ConstantSchedulerConfig):
    """``alpha`` until ``t_max``, then 1.0."""

    config: ConstantSchedulerConfig

    def __init__(self, config: ConstantSchedulerConfig | None = None, /, **options: Any):
        super().__init__(config, **options)
        self.alpha, self.t_max = self.config.alpha, ensure_time(self.config.t_max, "t_max")

    def __call__(self, state: State) -> float:
        return self.alpha if state.elapsed_fraction() < as_fraction(self.t_max, state) else 1.0


@dataclass(kw_only=True)
class LinearSchedulerConfig:
    alpha_i: float = 1.0
    """The multiplier at the start."""
    alpha_f: float = 0.0
    """The multiplier at ``t_max`` and after."""
    t_max: Time | str | int = "1dur"
    """How long the ramp from ``alpha_i`` to ``alpha_f`` takes (positive: ``"1dur"``,
    ``"2ep"``, ...)."""

    def __post_init__(self) -> None:
        _check_alpha("alpha_i", self.alpha_i)
        _check_alpha("alpha_f", self.alpha_f)
        _positive_time("t_max", self.t_max)


class LinearScheduler(Configurable, config=LinearSchedulerConfig):
    """Linear from ``alpha_i`` to ``alpha_f`` over ``t_max``, then ``alpha_f``."""

    config: LinearSchedulerConfig

    def __init__(self, config: LinearSchedulerConfig | None = None, /, **options: Any):
        super().__init__(config, **options)
        self.alpha_i, self.alpha_f = self.config.alpha_i, self.config.alpha_f
        self.t_max = _positive_time("t_max", self.config.t_max)

    def __call__(self, state: State) -> float:
        progress = min(state.elapsed_fraction() / as_fraction(self.t_max, state), 1.0)
        return self.alpha_i + (self.alpha_f - self.alpha_i) * progress


@dataclass(kw_only=True)
class ExponentialSchedulerConfig:
    gamma: float
    """The multiplier after each ``decay_period`` (applied continuously in between)."""
    decay_period: Time | str | int = "1ep"
    """The period over which the learning rate is multiplied by ``gamma`` (positive)."""

    def __post_init__(self) -> None:
        _check_alpha("gamma", self.gamma)
        _positive_time("decay_period", self.decay_period)


class ExponentialScheduler(Configurable, config=ExponentialSchedulerConfig):
    """``gamma ** (elapsed / decay_period)``."""

    config: ExponentialSchedulerConfig

    def __init__(self, config: ExponentialSchedulerConfig | None = None, /, **options: Any):
        super().__init__(config, **options)
        self.gamma = self.config.gamma
        self.decay_period = _positive_time("decay_period", self.config.decay_period)

    def __call__(self, state: State) -> float:
        return self.gamma ** (state.elapsed_fraction() / as_fraction(self.decay_period, state))


@dataclass(kw_only=True)
class StepSchedulerConfig:
    step_size: Time | str | int
    """How often to multiply by ``gamma`` (positive: ``"1ep"``, ``"0.1dur"``, ...)."""
    gamma: float = 0.1
    """The multiplier applied at every step."""

    def __post_init__(self) -> None:
        _check_alpha("gamma", self.gamma)
        _positive_time("step_size", self.step_size)


class StepScheduler(Configurable, config=StepSchedulerConfig):
    """Multiply by ``gamma`` every ``step_size``."""

    config: StepSchedulerConfig

    def __init__(self, config: StepSchedulerConfig | None = None, /, **options: Any):
        super().__init__(config, **options)
        self.step_size = _positive_time("step_size", self.config.step_size)
        self.gamma = self.config.gamma

    def __call__(self, state: State) -> float:
        steps = math.floor(state.elapsed_fraction() / as_fraction(self.step_size, state) + 1e-9)
        return self.gamma**steps


@dataclass(kw_only=True)
class MultiStepSchedulerConfig:
    milestones: list[Time | str | int]
    """When to multiply by ``gamma``, e.g. ``["0.3dur", "0.6dur"]`` or ``["30ep", "60ep"]``."""
    gamma: float = 0.1
    """The multiplier applied at each milestone."""

    def __post_init__(self) -> None:
        _check_alpha("gamma", self.gamma)
        if isinstance(self.milestones, str | bytes) or not hasattr(self.milestones, "__iter__"):
            raise ValueError(
                f"milestones must be a list of durations, e.g. ['0.3dur', '0.6dur'], "
                f"got {self.milestones!r}"
            )
        for milestone in self.milestones:
            ensure_time(milestone, "milestone")


class MultiStepScheduler(Configurable, config=MultiStepSchedulerConfig):
    """Multiply by ``gamma`` at each milestone, e.g. ``milestones=["0.3dur", "0.6dur"]``."""

    config: MultiStepSchedulerConfig

    def __init__(self, config: MultiStepSchedulerConfig | None = None, /, **options: Any):
        super().__init__(config, **options)
        self.milestones = [ensure_time(m, "milestone") for m in self.config.milestones]
        self.gamma = self.config.gamma

    def __call__(self, state: State) -> float:
        elapsed = state.elapsed_fraction() + 1e-9
        passed = sum(1 for m in self.milestones if elapsed >= as_fraction(m, state))
        return self.gamma**passed


@dataclass(kw_only=True)
class PolynomialSchedulerConfig:
    power: float
    """The exponent of the decay (1.0 is linear, 2.0 quadratic)."""
    t_max: Time | str | int = "1dur"
    """How long the decay to ``alpha_f`` takes (positive)."""
    alpha_f: float = 0.0
    """The multiplier at ``t_max`` and after."""

    def __post_init__(self) -> None:
        if not _is_number(self.power) or not math.isfinite(self.power):
            raise ValueError(f"power must be a finite number, got {self.power!r}")
        _check_alpha("alpha_f", self.alpha_f)
        _positive_time("t_max", self.t_max)


class PolynomialScheduler(Configurable, config=PolynomialSchedulerConfig):
    """``alpha_f + (1 - alpha_f) * (1 - progress) ** power`` over ``t_max``."""

    config: PolynomialSchedulerConfig

    def __init__(self, config: PolynomialSchedulerConfig | None = None, /, **options: Any):
        super().__init__(config, **options)
        self.power, self.alpha_f = self.config.power, self.config.alpha_f
        self.t_max = _positive_time("t_max", self.config.t_max)

    def __call__(self, state: State) -> float:
        progress = min(state.elapsed_fraction() / as_fraction(self.t_max, state), 1.0)
        return self.alpha_f + (1 - self.alpha_f) * (1 - progress) ** self.power


@dataclass(kw_only=True)
class CosineAnnealingSchedulerConfig:
    t_max: Time | str | int = "1dur"
    """How long the half cosine from 1 to ``alpha_f`` takes (positive)."""
    alpha_f: float = 0.0
    """The multiplier at ``t_max`` and after."""

    def __post_init__(self) -> None:
        _check_alpha("alpha_f", self.alpha_f)
        _positive_time("t_max", self.t_max)


class CosineAnnealingScheduler(Configurable, config=CosineAnnealingSchedulerConfig):
    """Half a cosine from 1 to ``alpha_f`` over ``t_max``."""

    config: CosineAnnealingSchedulerConfig

    def __init__(self, config: CosineAnnealingSchedulerConfig | None = None, /, **options: Any):
        super().__init__(config, **options)
        self.t_max = _positive_time("t_max", self.config.t_max)
        self.alpha_f = self.config.alpha_f

    def __call__(self, state: State) -> float:
        progress = min(state.elapsed_fraction() / as_fraction(self.t_max, state), 1.0)
        return _cosine(progress, self.alpha_f)


def _cosine(progress: float, alpha_f: float) -> float:
    return alpha_f + (1 - alpha_f) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass(kw_only=True)
class _WarmupConfig:
    t_warmup: Time | str | int
    """How long the linear warm-up from 0 to 1 takes (``"0.1dur"``, ``"2ep"``, ``"500ba"``);
    it must not be longer than ``t_max``."""
    alpha_f: float = 0.0
    """The multiplier at ``t_max`` and after."""
    t_max: Time | str | int = "1dur"
    """When the decay after the warm-up reaches ``alpha_f`` (counted from the start)."""

    def __post_init__(self) -> None:
        _check_alpha("alpha_f", self.alpha_f)
        ensure_time(self.t_warmup, "t_warmup")
        ensure_time(self.t_max, "t_max")


class _Warmup(Configurable):
    """Linear warm-up from 0 to 1 over ``t_warmup``, then ``after(progress)`` on the rest."""

    config: _WarmupConfig

    def __init__(self, config: _WarmupConfig | None = None, /, **options: Any):
        super().__init__(config, **options)
        self.t_warmup = ensure_time(self.config.t_warmup, "t_warmup")
        self.t_max = ensure_time(self.config.t_max, "t_max")
        self.alpha_f = self.config.alpha_f

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


@dataclass(kw_only=True)
class LinearWithWarmupSchedulerConfig(_WarmupConfig):
    """Options of `LinearWithWarmupScheduler`."""


class LinearWithWarmupScheduler(_Warmup, config=LinearWithWarmupSchedulerConfig):
    """Warm up linearly over ``t_warmup``, then decay linearly from 1 to ``alpha_f``."""

    config: LinearWithWarmupSchedulerConfig

    def _after(self, progress: float) -> float:
        return 1 + (self.alpha_f - 1) * progress


@dataclass(kw_only=True)
class CosineAnnealingWithWarmupSchedulerConfig(_WarmupConfig):
    """Options of `CosineAnnealingWithWarmupScheduler`."""


class CosineAnnealingWithWarmupScheduler(_Warmup, config=CosineAnnealingWithWarmupSchedulerConfig):
    """Warm up linearly over ``t_warmup``, then half a cosine from 1 to ``alpha_f``."""

    config: CosineAnnealingWithWarmupSchedulerConfig

    def _after(self, progress: float) -> float:
        return _cosine(progress, self.alpha_f)
