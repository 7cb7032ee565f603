"""Turn ``"500ba"`` / ``"1ep"`` / ``"0.25dur"`` / a callable into "does it fire now?"."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from trainkit.core._event import Event
from trainkit.core._time import Time, Timestamp, TimeUnit, ensure_time

if TYPE_CHECKING:
    from trainkit.core._state import State

__all__ = ["IntervalTrigger", "as_fraction", "interval_trigger"]

IntervalTrigger = Callable[..., bool]
"""A ``(state: State, event: Event) -> bool``: does the interval fire now? (Written with
``...`` so that `typing.get_type_hints` reads it cleanly in configs.)"""


def interval_trigger(
    interval: Time | str | int | IntervalTrigger, *, at_end: bool = True
) -> IntervalTrigger:
    """A ``(state, event) -> bool`` that is true at BATCH_END / EPOCH_END every ``interval``.

    Epoch intervals fire at EPOCH_END; every other unit fires at the BATCH_END where the
    count crosses a multiple of the interval. With ``at_end`` it also fires at the last
    batch of training, so the final result is always evaluated (or saved). A callable is
    returned as it is.
    """
    if callable(interval) and not isinstance(interval, Time | str | int):
        return interval
    every = ensure_time(interval, "interval")
    if every.value == 0:
        raise ValueError(f"interval {interval!r} is zero; use a positive interval such as '1ep'")
    if every.unit == TimeUnit.ITERATION:
        Timestamp().get(every.unit)  # raises: trainkit does not count iterations (says why)
    if every.unit == TimeUnit.EPOCH:

        def fire_on_epochs(state: State, event: Event) -> bool:
            if event == Event.EPOCH_END:
                return state.timestamp.epoch % every.value == 0 or (at_end and state.is_done())
            return event == Event.BATCH_END and at_end and _ends_mid_epoch(state)

        return fire_on_epochs

    previous: list[float] = []

    def fire_on_count(state: State, event: Event) -> bool:
        if event != Event.BATCH_END:
            return False
        now = _count(state, every.unit)
        before = previous[0] if previous else _count_one_batch_ago(state, now)
        previous[:] = [now]
        crossed = math.floor(now / every.value + 1e-9) > math.floor(before / every.value + 1e-9)
        return crossed or (at_end and state.is_done())

    return fire_on_count


def _count(state: State, unit: TimeUnit) -> float:
    return state.elapsed_fraction() if unit == TimeUnit.DURATION else state.timestamp.get(unit)


def _count_one_batch_ago(state: State, now: float) -> float:
    # First call in this process (fresh run or resumed): assume a steady rate per batch.
    batch = state.timestamp.batch
    return now * (batch - 1) / batch if batch > 0 else 0.0


def _ends_mid_epoch(state: State) -> bool:
    # Training that stops mid-epoch (e.g. max_duration="500ba") gets its final trigger
    # at that batch, since no EPOCH_END follows. When the last batch also ends the epoch,
    # EPOCH_END follows and fires instead, so the trigger does not fire twice.
    return (
        state.is_done()
        and state.max_duration is not None
        and state.max_duration.unit != TimeUnit.EPOCH
        and state.timestamp.batch_in_epoch != state.dataloader_len
    )


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
