"""The schedules that warm up first (linear from 0 over ``t_warmup``), then decay."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainkit.core import Time, ensure_time
from trainkit.core.config import Configurable, primary
from trainkit.trainer._schedule_time import (
    _check_alpha,
    _check_milestones,
    _check_warmup,
    _cosine,
    _is_number,
    _multistep,
    _position,
    _positive_time,
)

if TYPE_CHECKING:
    from trainkit.core import State


@dataclass(kw_only=True)
class _WarmupConfig:
    t_warmup: Time | str | int = primary()
    """How long the linear warm-up from 0 takes (``"0.1dur"``, ``"2ep"``, ``"500ba"``);
    it must not be longer than ``t_max``."""
    alpha_f: float = 0.0
    """The multiplier at ``t_max`` and after."""
    t_max: Time | str | int = "1dur"
    """When the decay after the warm-up reaches ``alpha_f`` (counted from the start)."""
    scale_warmup: bool = False
    """Whether ``scale_schedule_ratio`` also scales ``t_warmup`` (by default only the rest
    of the schedule is scaled; a ``"dur"`` warm-up follows ``max_duration`` either way)."""

    def __post_init__(self) -> None:
        _check_alpha("alpha_f", self.alpha_f)
        _check_warmup(self.t_warmup, self.scale_warmup)
        ensure_time(self.t_max, "t_max")


class _Warmup(Configurable):
    """Linear warm-up from 0 to ``_peak`` over ``t_warmup``, then ``_after(progress)`` on the
    rest of ``t_max``."""

    config: _WarmupConfig

    def __init__(self, config: _WarmupConfig | None = None, /, **options: Any):
        super().__init__(config, **options)
        self.t_warmup = ensure_time(self.config.t_warmup, "t_warmup")
        self.t_max = ensure_time(self.config.t_max, "t_max")
        self.alpha_f = self.config.alpha_f
        self.scale_warmup = self.config.scale_warmup

    _peak = 1.0

    def _after(self, progress: float, state: State, ssr: float) -> float:
        raise NotImplementedError

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        warmup_ssr = ssr if self.scale_warmup else 1.0
        elapsed, warmup, measure = _position(self.t_warmup, state, warmup_ssr)
        _, total, total_measure = _position(self.t_max, state, ssr)
        if measure != total_measure:
            raise ValueError(
                f"t_warmup {self.t_warmup} and t_max {self.t_max} are measured differently "
                f"({measure} vs {total_measure}) in a run of {state.max_duration}; give both "
                "in the same unit"
            )
        if warmup > total:
            raise ValueError(f"t_warmup {self.t_warmup} is longer than t_max {self.t_max}")
        if elapsed < warmup:
            return self._peak * elapsed / warmup
        if total == warmup:
            return self._after(1.0, state, ssr)
        return self._after(min((elapsed - warmup) / (total - warmup), 1.0), state, ssr)


@dataclass(kw_only=True)
class LinearWithWarmupSchedulerConfig(_WarmupConfig):
    """Options of `LinearWithWarmupScheduler`."""

    alpha_i: float = 1.0
    """The multiplier the warm-up reaches, where the linear decay starts."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_alpha("alpha_i", self.alpha_i)


class LinearWithWarmupScheduler(_Warmup, config=LinearWithWarmupSchedulerConfig):
    """Warm up linearly to ``alpha_i`` over ``t_warmup``, then go linearly to ``alpha_f``."""

    config: LinearWithWarmupSchedulerConfig

    @property
    def _peak(self) -> float:  # type: ignore[override]
        return self.config.alpha_i

    def _after(self, progress: float, state: State, ssr: float) -> float:
        return self._peak + (self.alpha_f - self._peak) * progress


@dataclass(kw_only=True)
class CosineAnnealingWithWarmupSchedulerConfig(_WarmupConfig):
    """Options of `CosineAnnealingWithWarmupScheduler`."""


class CosineAnnealingWithWarmupScheduler(_Warmup, config=CosineAnnealingWithWarmupSchedulerConfig):
    """Warm up linearly over ``t_warmup``, then half a cosine from 1 to ``alpha_f``."""

    config: CosineAnnealingWithWarmupSchedulerConfig

    def _after(self, progress: float, state: State, ssr: float) -> float:
        return _cosine(progress, self.alpha_f)


@dataclass(kw_only=True)
class PolynomialWithWarmupSchedulerConfig(_WarmupConfig):
    """Options of `PolynomialWithWarmupScheduler`."""

    power: float = 2.0
    """The exponent of the decay after the warm-up (1.0 is linear, 2.0 quadratic)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not _is_number(self.power) or not math.isfinite(self.power):
            raise ValueError(f"power must be a finite number, got {self.power!r}")


class PolynomialWithWarmupScheduler(_Warmup, config=PolynomialWithWarmupSchedulerConfig):
    """Warm up linearly over ``t_warmup``, then ``alpha_f + (1 - alpha_f) * (1 - progress)
    ** power`` on the rest of ``t_max``."""

    config: PolynomialWithWarmupSchedulerConfig

    def _after(self, progress: float, state: State, ssr: float) -> float:
        return self.alpha_f + (1 - self.alpha_f) * (1 - progress) ** self.config.power


@dataclass(kw_only=True)
class ConstantWithWarmupSchedulerConfig:
    t_warmup: Time | str | int = primary()
    """How long the linear warm-up from 0 to ``alpha`` takes (``"0.1dur"``, ``"2ep"``, ...);
    it must not be longer than ``t_max``."""
    alpha: float = 1.0
    """The multiplier held after the warm-up."""
    t_max: Time | str | int = "1dur"
    """The length of the schedule (counted from the start); ``alpha`` holds after it too."""
    scale_warmup: bool = False
    """Whether ``scale_schedule_ratio`` also scales ``t_warmup``."""

    def __post_init__(self) -> None:
        _check_alpha("alpha", self.alpha)
        _check_warmup(self.t_warmup, self.scale_warmup)
        ensure_time(self.t_max, "t_max")


class ConstantWithWarmupScheduler(Configurable, config=ConstantWithWarmupSchedulerConfig):
    """Warm up linearly to ``alpha`` over ``t_warmup``, then hold ``alpha``."""

    config: ConstantWithWarmupSchedulerConfig

    def __init__(self, config: ConstantWithWarmupSchedulerConfig | None = None, /, **options: Any):
        super().__init__(config, **options)
        c = self.config
        self._schedule = LinearWithWarmupScheduler(
            t_warmup=c.t_warmup,
            alpha_i=c.alpha,
            alpha_f=c.alpha,
            t_max=c.t_max,
            scale_warmup=c.scale_warmup,
        )

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        return self._schedule(state, ssr)


@dataclass(kw_only=True)
class MultiStepWithWarmupSchedulerConfig:
    t_warmup: Time | str | int = primary()
    """How long the linear warm-up from 0 to 1 takes (``"0.1dur"``, ``"2ep"``, ...);
    milestones before its end have no effect."""
    milestones: list[Time | str | int]
    """When to multiply by ``gamma`` (counted from the start), e.g. ``["30ep", "60ep"]``."""
    gamma: float = 0.1
    """The multiplier applied at each milestone."""
    scale_warmup: bool = False
    """Whether ``scale_schedule_ratio`` also scales ``t_warmup``."""

    def __post_init__(self) -> None:
        _check_warmup(self.t_warmup, self.scale_warmup)
        _check_milestones(self.milestones, self.gamma)


class MultiStepWithWarmupScheduler(Configurable, config=MultiStepWithWarmupSchedulerConfig):
    """Warm up linearly over ``t_warmup``, then multiply by ``gamma`` at each milestone."""

    config: MultiStepWithWarmupSchedulerConfig

    def __init__(self, config: MultiStepWithWarmupSchedulerConfig | None = None, /, **options: Any):
        super().__init__(config, **options)
        self.t_warmup = ensure_time(self.config.t_warmup, "t_warmup")
        self.milestones = [ensure_time(m, "milestone") for m in self.config.milestones]
        self.gamma = self.config.gamma

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        warmup_ssr = ssr if self.config.scale_warmup else 1.0
        elapsed, warmup, _ = _position(self.t_warmup, state, warmup_ssr)
        if elapsed < warmup:
            return elapsed / warmup
        return _multistep(self.milestones, self.gamma, state, ssr)


@dataclass(kw_only=True)
class CosineAnnealingWarmRestartsSchedulerConfig:
    t_0: Time | str | int = primary()
    """The length of the first cosine cycle (positive: ``"0.25dur"``, ``"2ep"``, ...)."""
    t_mult: float = 1.0
    """Each cycle is ``t_mult`` times as long as the one before (at least 1)."""
    alpha_f: float = 0.0
    """The multiplier at the end of every cycle."""

    def __post_init__(self) -> None:
        _positive_time("t_0", self.t_0)
        _check_alpha("alpha_f", self.alpha_f)
        if not _is_number(self.t_mult) or not math.isfinite(self.t_mult) or self.t_mult < 1:
            raise ValueError(f"t_mult must be a finite number >= 1, got {self.t_mult!r}")


class CosineAnnealingWarmRestartsScheduler(
    Configurable, config=CosineAnnealingWarmRestartsSchedulerConfig
):
    """Half a cosine from 1 to ``alpha_f`` over ``t_0``, then again from 1 over cycles each
    ``t_mult`` times longer."""

    config: CosineAnnealingWarmRestartsSchedulerConfig

    def __init__(
        self, config: CosineAnnealingWarmRestartsSchedulerConfig | None = None, /, **options: Any
    ):
        super().__init__(config, **options)
        self.t_0 = _positive_time("t_0", self.config.t_0)
        self.t_mult, self.alpha_f = self.config.t_mult, self.config.alpha_f

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        elapsed, length, measure = _position(self.t_0, state, ssr)
        whole = measure != "dur"  # counts of batches, samples, ... stay whole, as Composer's
        start = 0.0
        while start + length <= elapsed + 1e-9:
            start += length
            length = int(length * self.t_mult) if whole else length * self.t_mult
        return _cosine((elapsed - start) / length, self.alpha_f)
