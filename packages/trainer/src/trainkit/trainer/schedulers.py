"""Learning-rate schedules that speak `Time`.

A schedule is a callable ``(state) -> float``: the multiplier applied to each parameter
group's initial learning rate at the current point of training. The Trainer re-reads them
after every batch. Times may be given as a fraction of ``max_duration`` (``"0.1dur"``) or
in epochs, batches, samples or tokens: a time in the unit of ``max_duration`` (or in
epochs/batches, through the data's length) is a fraction of the run; one in another unit
(``"500ba"`` in a run of ``"1e6tok"``) is compared with the run's own count of that unit,
as Composer does. With ``scale_schedule_ratio`` (a Trainer setting) every time except
``"dur"`` fractions, which follow the scaled ``max_duration``, and warm-ups (unless
``scale_warmup=True``) is multiplied by the ratio. torch's own LR schedulers are accepted
too; see the Trainer's ``step_schedulers_every_batch`` for when they are stepped.

Each schedule is a component: its options are one config dataclass (``XSchedulerConfig``,
a docstring per field), and keyword arguments build it::

    LinearWithWarmupScheduler(t_warmup="0.1dur", alpha_f=0.0)
    LinearWithWarmupScheduler(LinearWithWarmupSchedulerConfig(t_warmup="0.1dur"))

They are registered in the ``trainkit.schedulers`` entry-point group (``constant``,
``constant_with_warmup``, ``linear``, ``linear_with_warmup``, ``cosine``,
``cosine_with_warmup``, ``cosine_warm_restarts``, ``multistep``, ``multistep_with_warmup``,
``exponential``, ``polynomial``, ``polynomial_with_warmup``, ``step``, ``wsd``), which is how
a config file names them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainkit.core import Time, ensure_time
from trainkit.core.config import Configurable, primary
from trainkit.trainer._schedule_time import (
    Scheduler,
    _check_alpha,
    _check_milestones,
    _cosine,
    _is_number,
    _multistep,
    _position,
    _positive_time,
    _progress,
)
from trainkit.trainer._warmup_schedules import (
    ConstantWithWarmupScheduler,
    ConstantWithWarmupSchedulerConfig,
    CosineAnnealingWarmRestartsScheduler,
    CosineAnnealingWarmRestartsSchedulerConfig,
    CosineAnnealingWithWarmupScheduler,
    CosineAnnealingWithWarmupSchedulerConfig,
    LinearWithWarmupScheduler,
    LinearWithWarmupSchedulerConfig,
    MultiStepWithWarmupScheduler,
    MultiStepWithWarmupSchedulerConfig,
    PolynomialWithWarmupScheduler,
    PolynomialWithWarmupSchedulerConfig,
)
from trainkit.trainer._wsd_schedule import (
    WarmupStableDecayScheduler,
    WarmupStableDecaySchedulerConfig,
)

if TYPE_CHECKING:
    from trainkit.core import State

__all__ = [
    "ConstantScheduler",
    "ConstantSchedulerConfig",
    "ConstantWithWarmupScheduler",
    "ConstantWithWarmupSchedulerConfig",
    "CosineAnnealingScheduler",
    "CosineAnnealingSchedulerConfig",
    "CosineAnnealingWarmRestartsScheduler",
    "CosineAnnealingWarmRestartsSchedulerConfig",
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
    "MultiStepWithWarmupScheduler",
    "MultiStepWithWarmupSchedulerConfig",
    "PolynomialScheduler",
    "PolynomialSchedulerConfig",
    "PolynomialWithWarmupScheduler",
    "PolynomialWithWarmupSchedulerConfig",
    "Scheduler",
    "StepScheduler",
    "StepSchedulerConfig",
    "WarmupStableDecayScheduler",
    "WarmupStableDecaySchedulerConfig",
]


# --- the schedules: a config dataclass each, validated once in __post_init__ ---------------


@dataclass(kw_only=True)
class ConstantSchedulerConfig:
    alpha: float = primary(1.0)
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

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        elapsed, span, _ = _position(self.t_max, state, ssr)
        return self.alpha if elapsed < span else 1.0


@dataclass(kw_only=True)
class LinearSchedulerConfig:
    alpha_i: float = primary(1.0)
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

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        progress = min(_progress(self.t_max, state, ssr), 1.0)
        return self.alpha_i + (self.alpha_f - self.alpha_i) * progress


@dataclass(kw_only=True)
class ExponentialSchedulerConfig:
    gamma: float = primary()
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

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        return self.gamma ** _progress(self.decay_period, state, ssr)


@dataclass(kw_only=True)
class StepSchedulerConfig:
    step_size: Time | str | int = primary()
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

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        steps = math.floor(_progress(self.step_size, state, ssr) + 1e-9)
        return self.gamma**steps


@dataclass(kw_only=True)
class MultiStepSchedulerConfig:
    milestones: list[Time | str | int] = primary()
    """When to multiply by ``gamma``, e.g. ``["0.3dur", "0.6dur"]`` or ``["30ep", "60ep"]``."""
    gamma: float = 0.1
    """The multiplier applied at each milestone."""

    def __post_init__(self) -> None:
        _check_milestones(self.milestones, self.gamma)


class MultiStepScheduler(Configurable, config=MultiStepSchedulerConfig):
    """Multiply by ``gamma`` at each milestone, e.g. ``milestones=["0.3dur", "0.6dur"]``."""

    config: MultiStepSchedulerConfig

    def __init__(self, config: MultiStepSchedulerConfig | None = None, /, **options: Any):
        super().__init__(config, **options)
        self.milestones = [ensure_time(m, "milestone") for m in self.config.milestones]
        self.gamma = self.config.gamma

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        return _multistep(self.milestones, self.gamma, state, ssr)


@dataclass(kw_only=True)
class PolynomialSchedulerConfig:
    power: float = primary()
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

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        progress = min(_progress(self.t_max, state, ssr), 1.0)
        return self.alpha_f + (1 - self.alpha_f) * (1 - progress) ** self.power


@dataclass(kw_only=True)
class CosineAnnealingSchedulerConfig:
    t_max: Time | str | int = primary("1dur")
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

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        progress = min(_progress(self.t_max, state, ssr), 1.0)
        return _cosine(progress, self.alpha_f)
