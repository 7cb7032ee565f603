"""Durations (`Time`) and the run's position in training (`Timestamp`)."""

from __future__ import annotations

import dataclasses
import math
import re
from enum import StrEnum
from typing import Any, Final

__all__ = ["Time", "TimeUnit", "Timestamp", "ensure_time"]


class TimeUnit(StrEnum):
    """Units a duration can be expressed in. The value is the suffix in a time string."""

    EPOCH = "ep"
    BATCH = "ba"
    SAMPLE = "sp"
    TOKEN = "tok"
    DURATION = "dur"
    SECOND = "sec"


_ACCEPTED: Final = (
    "use a number followed by a unit: '10ep' (epochs), '500ba' (batches), '2048sp' (samples), "
    "'1e6tok' (tokens), '0.25dur' (fraction of max_duration), or wall-clock time such as "
    "'1h30m', '45m', '90s'; an int means epochs"
)
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_UNIT_RE: Final = re.compile(rf"^\s*({_NUMBER})\s*(ep|ba|sp|tok|dur|sec)\s*$")
_CLOCK_RE: Final = re.compile(rf"^\s*(?:({_NUMBER})h)?\s*(?:({_NUMBER})m)?\s*(?:({_NUMBER})s)?\s*$")
_INTEGRAL_UNITS: Final = {
    TimeUnit.EPOCH: "epochs",
    TimeUnit.BATCH: "batches",
    TimeUnit.SAMPLE: "samples",
    TimeUnit.TOKEN: "tokens",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Time:
    """A non-negative amount of time in one unit, e.g. ``Time(10, TimeUnit.EPOCH)``.

    Epochs, batches, samples and tokens are whole numbers; durations are fractions of
    ``max_duration``; seconds are wall-clock time.
    """

    value: int | float
    unit: TimeUnit

    def __post_init__(self) -> None:
        unit = TimeUnit(self.unit)
        object.__setattr__(self, "unit", unit)
        value = self.value
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ValueError(f"time value {value!r} is not a finite number; {_ACCEPTED}")
        if value < 0:
            raise ValueError(f"time {value}{unit.value} is negative; {_ACCEPTED}")
        if unit in _INTEGRAL_UNITS:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(
                    f"time {value}{unit.value} is not a whole number of "
                    f"{_INTEGRAL_UNITS[unit]}; {_ACCEPTED}"
                )
            object.__setattr__(self, "value", int(value))
        else:
            object.__setattr__(self, "value", float(value))

    @classmethod
    def from_timestring(cls, text: str) -> Time:
        """Parse ``"10ep"``, ``"500ba"``, ``"2048sp"``, ``"1e6tok"``, ``"0.25dur"``, ``"1h30m"``."""
        if not isinstance(text, str):
            raise TypeError(f"time string must be a str, got {type(text).__name__} {text!r}")
        if match := _UNIT_RE.match(text):
            return cls(_number(match.group(1)), TimeUnit(match.group(2)))
        clock = _CLOCK_RE.match(text)
        if clock and any(clock.groups()):
            hours, minutes, seconds = (float(g) if g else 0.0 for g in clock.groups())
            return cls(hours * 3600 + minutes * 60 + seconds, TimeUnit.SECOND)
        raise ValueError(f"{text!r} is not a duration; {_ACCEPTED}")

    def __str__(self) -> str:
        return f"{self.value}{self.unit.value}"


def _number(text: str) -> int | float:
    # Whole numbers stay ints so that large counts ("12345678901234567891sp") are exact.
    return int(text) if text.isdigit() else float(text)


def ensure_time(value: Time | str | int, what: str = "duration") -> Time:
    """Accept a `Time`, a time string, or an int (epochs); raise a clear error otherwise."""
    if isinstance(value, Time):
        return value
    if isinstance(value, str):
        try:
            return Time.from_timestring(value)
        except ValueError as err:
            raise ValueError(f"{what} {value!r} is not a duration; {_ACCEPTED}") from err
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{what} {value} is negative; {_ACCEPTED}")
        return Time(value, TimeUnit.EPOCH)
    raise TypeError(
        f"{what} must be a Time, a string or an int, got {type(value).__name__} {value!r}"
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Timestamp:
    """Where the run is. Immutable: the loop replaces it with `to_next_batch` / `to_next_epoch`.

    Sample and token counts are global (summed over ranks); wall-clock times are seconds.
    """

    epoch: int = 0
    batch: int = 0
    sample: int = 0
    token: int = 0
    batch_in_epoch: int = 0
    sample_in_epoch: int = 0
    token_in_epoch: int = 0
    total_wct: float = 0.0
    epoch_wct: float = 0.0
    batch_wct: float = 0.0

    def get(self, unit: TimeUnit | str) -> int | float:
        """The count in ``unit`` (epochs, batches, samples, tokens or seconds)."""
        if unit == TimeUnit.BATCH:
            return self.batch
        if unit == TimeUnit.EPOCH:
            return self.epoch
        if unit == TimeUnit.SAMPLE:
            return self.sample
        if unit == TimeUnit.TOKEN:
            return self.token
        if unit == TimeUnit.SECOND:
            return self.total_wct
        if unit == TimeUnit.DURATION:
            raise ValueError("a Timestamp has no 'dur' count; use State.elapsed_fraction()")
        raise ValueError(f"unknown time unit {unit!r}; use one of {[u.value for u in TimeUnit]}")

    def to_next_batch(self, samples: int, tokens: int = 0, duration: float = 0.0) -> Timestamp:
        # Built directly rather than with dataclasses.replace: this runs every step.
        return Timestamp(
            self.epoch,
            self.batch + 1,
            self.sample + samples,
            self.token + tokens,
            self.batch_in_epoch + 1,
            self.sample_in_epoch + samples,
            self.token_in_epoch + tokens,
            self.total_wct + duration,
            self.epoch_wct + duration,
            duration,
        )

    def to_next_epoch(self) -> Timestamp:
        return dataclasses.replace(
            self,
            epoch=self.epoch + 1,
            batch_in_epoch=0,
            sample_in_epoch=0,
            token_in_epoch=0,
            epoch_wct=0.0,
        )

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Timestamp:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(state) - fields
        if unknown:
            raise ValueError(
                f"unknown Timestamp fields {sorted(unknown)}; expected {sorted(fields)}"
            )
        return cls(**{k: (v.item() if hasattr(v, "item") else v) for k, v in state.items()})
