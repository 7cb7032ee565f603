"""What the schedules share: the `Scheduler` protocol and times as progress through a run."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from trainkit.core import Time, TimeUnit, ensure_time
from trainkit.core.interval import as_fraction

if TYPE_CHECKING:
    from trainkit.core import State


@runtime_checkable
class Scheduler(Protocol):
    """A schedule: the learning-rate multiplier at the current point of ``state``.

    ``ssr`` is the run's ``scale_schedule_ratio``; a schedule that takes only ``state``
    works too, but cannot be used with a ratio other than 1.
    """

    def __call__(self, state: State, ssr: float = 1.0) -> float: ...


def _scaled(time: Time, state: State, ssr: float) -> Time:
    """``time`` multiplied by ``ssr`` (epochs become batches first, for granularity)."""
    if ssr == 1.0 or time.unit == TimeUnit.DURATION:
        return time
    if time.unit == TimeUnit.SECOND:
        return Time(time.value * ssr, time.unit)
    if time.unit == TimeUnit.EPOCH and state.dataloader_len is not None:
        time = Time(time.value * state.dataloader_len, TimeUnit.BATCH)
    scaled = Time(int(time.value * ssr), time.unit)
    if scaled.value == 0 and time.value != 0:
        raise ValueError(
            f"scale_schedule_ratio {ssr} makes the schedule time {time} zero; use a larger ratio"
        )
    return scaled


def _position(time: Time | str | int, state: State, ssr: float = 1.0) -> tuple[float, float, str]:
    """``(elapsed, span, measure)``: how far the run is and how long ``time`` is, in one
    measure. Times convertible to a fraction of ``max_duration`` are fractions of the run
    (measure ``"dur"``); a count the run keeps in another unit (``"500ba"`` when
    ``max_duration`` is in tokens) is compared with the run's own count of that unit.
    """
    time = _scaled(ensure_time(time, "scheduler time"), state, ssr)
    try:
        return state.elapsed_fraction(), as_fraction(time, state), "dur"
    except ValueError:
        if state.max_duration is None or time.unit in (TimeUnit.DURATION, TimeUnit.SECOND):
            raise
        if time.unit == TimeUnit.EPOCH:
            if state.dataloader_len is None:
                raise  # an epoch count is too coarse; batches need the data's length
            time = Time(time.value * state.dataloader_len, TimeUnit.BATCH)
        elif time.unit == TimeUnit.BATCH and state.max_duration.unit == TimeUnit.EPOCH:
            raise  # batches against epochs need the data's length; there is none
    return float(state.timestamp.get(time.unit)), float(time.value), time.unit.value


def _progress(time: Time | str | int, state: State, ssr: float = 1.0) -> float:
    """How far through ``time`` the run is (not clipped)."""
    elapsed, span, _ = _position(time, state, ssr)
    return elapsed / span if span > 0 else 1.0


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


def _check_milestones(milestones: Any, gamma: float) -> None:
    _check_alpha("gamma", gamma)
    if isinstance(milestones, str | bytes) or not hasattr(milestones, "__iter__"):
        raise ValueError(
            f"milestones must be a list of durations, e.g. ['0.3dur', '0.6dur'], got {milestones!r}"
        )
    for milestone in milestones:
        ensure_time(milestone, "milestone")


def _check_warmup(t_warmup: Time | str | int, scale_warmup: Any) -> None:
    """The checks every warm-up schedule's config shares."""
    ensure_time(t_warmup, "t_warmup")
    if not isinstance(scale_warmup, bool):
        raise ValueError(f"scale_warmup must be True or False, got {scale_warmup!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _multistep(milestones: list[Time], gamma: float, state: State, ssr: float) -> float:
    passed = 0
    for milestone in milestones:
        elapsed, at, _ = _position(milestone, state, ssr)
        passed += elapsed + 1e-9 >= at
    return gamma**passed


def _cosine(progress: float, alpha_f: float) -> float:
    return alpha_f + (1 - alpha_f) * 0.5 * (1 + math.cos(math.pi * progress))
