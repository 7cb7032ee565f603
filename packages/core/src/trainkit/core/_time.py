"""Durations (`Time`) and the run's position in training (`Timestamp`)."""

from __future__ import annotations

import dataclasses
import math
import re
from enum import StrEnum
from typing import Any, Final, NamedTuple

__all__ = ["Time", "TimeUnit", "Timestamp", "ensure_time"]


class TimeUnit(StrEnum):
    """Units a duration can be expressed in. The value is the suffix in a time string."""

    EPOCH = "ep"
    BATCH = "ba"
    SAMPLE = "sp"
    TOKEN = "tok"
    DURATION = "dur"
    SECOND = "sec"
    #: Composer's unit for a group of epochs (Composer's ``State._iteration_length``). Times
    #: in iterations parse and do arithmetic, but trainkit does not count iterations: a
    #: run is one iteration, so ``max_duration``, ``fit(duration=...)`` and intervals in
    #: ``iter`` are refused (`Timestamp.get` names the units that are counted).
    ITERATION = "iter"


_ACCEPTED: Final = (
    "use a number followed by a unit: '10ep' (epochs), '500ba' (batches), '2048sp' (samples), "
    "'1e6tok' (tokens), '0.25dur' (fraction of max_duration), or wall-clock time such as "
    "'1h30m', '45m', '90s'; an int means epochs"
)
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_UNIT_RE: Final = re.compile(rf"^\s*({_NUMBER})\s*(ep|ba|sp|tok|dur|sec|iter)\s*$")
_CLOCK_RE: Final = re.compile(rf"^\s*(?:({_NUMBER})h)?\s*(?:({_NUMBER})m)?\s*(?:({_NUMBER})s)?\s*$")
_INTEGRAL_UNITS: Final = {
    TimeUnit.EPOCH: "epochs",
    TimeUnit.BATCH: "batches",
    TimeUnit.SAMPLE: "samples",
    TimeUnit.TOKEN: "tokens",
    TimeUnit.ITERATION: "iterations",
}
_COUNTED: Final = "'ep', 'ba', 'sp', 'tok' or wall-clock time ('sec', '1h30m')"


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Time:
    """A non-negative amount of time in one unit, e.g. ``Time(10, TimeUnit.EPOCH)``.

    Epochs, batches, samples, tokens and iterations are whole numbers; durations are
    fractions of ``max_duration``; seconds are wall-clock time.

    Arithmetic and comparison follow Composer's ``Time`` (below, ``Time("5ba")`` is short
    for ``Time.from_timestring("5ba")``). The other operand may be a
    `Time`, a time string (``Time("2ep") + "1ep"``) or a bare number, which is taken in
    this Time's unit (``Time("5ba") < 10`` compares batches; unlike `ensure_time`, where
    an int alone means epochs, here the Time on the left gives the unit):

    - ``+``, ``-``, ``%`` and ``< <= > >=`` need the same unit; the result keeps it. A
      negative result is an error (a Time is never negative).
    - ``time * number`` and ``time / number`` scale the value; counts are truncated to a
      whole number as Composer does (``Time("5ba") * 0.5 == Time("2ba")``).
    - ``time * Time(x, "dur")`` scales by a fraction (``Time("10ep") * "0.5dur"`` is 5ep).
    - ``a / b`` of two Times in one unit is their ratio as a ``Time`` in ``dur``;
      ``float(a / b)`` gives the number.
    - Different units cannot be compared or combined: they are related only through a
      run's progress (batches per epoch, samples per batch). This raises `TypeError`;
      convert first. ``==`` between different units is False rather than an error,
      so Times can sit in sets and dicts; the hash is the value's hash, which keeps
      ``Time("5ba") == 5`` consistent (a Time never hashes like its string).
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

    @classmethod
    def from_epoch(cls, epoch: int) -> Time:
        return cls(epoch, TimeUnit.EPOCH)

    @classmethod
    def from_batch(cls, batch: int) -> Time:
        return cls(batch, TimeUnit.BATCH)

    @classmethod
    def from_sample(cls, sample: int) -> Time:
        return cls(sample, TimeUnit.SAMPLE)

    @classmethod
    def from_token(cls, token: int) -> Time:
        return cls(token, TimeUnit.TOKEN)

    @classmethod
    def from_duration(cls, duration: float) -> Time:
        return cls(duration, TimeUnit.DURATION)

    @classmethod
    def from_iteration(cls, iteration: int) -> Time:
        return cls(iteration, TimeUnit.ITERATION)

    def __str__(self) -> str:
        return f"{self.value}{self.unit.value}"

    def to_timestring(self) -> str:
        """The time string that `from_timestring` parses back, e.g. ``"10ep"``."""
        return str(self)

    # --- comparison and arithmetic (Composer's semantics; see the class docstring) ----------

    def _other(self, other: object) -> Time | None:
        # A Time, a time string, or a bare number in this Time's unit; None if none of those.
        if isinstance(other, Time):
            return other
        if isinstance(other, str):
            return Time.from_timestring(other)
        if isinstance(other, int | float) and not isinstance(other, bool):
            return Time(other, self.unit)
        return None

    def _same_unit(self, other: object, verb: str) -> Time | None:
        time = self._other(other)
        if time is not None and time.unit != self.unit:
            raise TypeError(
                f"cannot {verb} {self} and {time}: they are in different units "
                f"({_unit_name(self.unit)} and {_unit_name(time.unit)}); convert one first, "
                f"e.g. through the run's progress (State.dataloader_len batches per epoch) "
                f"or a fraction of max_duration, or give both in one unit"
            )
        return time

    def _make(self, value: float, what: str) -> Time:
        if not math.isfinite(value):
            raise ValueError(f"{what} is not a finite number of {_unit_name(self.unit)}")
        if value < 0:
            raise ValueError(
                f"{what} is negative ({value}{self.unit.value}); a Time is never negative"
            )
        if self.unit in _INTEGRAL_UNITS:
            value = int(value)
        return Time(value, self.unit)

    def _compared(self, other: object) -> int | float | None:
        # The value to compare with: a bare number as it is (it may be fractional even
        # for counts: ``Time("5ba") < 7.5``), otherwise a Time in this unit.
        if isinstance(other, int | float) and not isinstance(other, bool):
            return other
        time = self._same_unit(other, "compare")
        return None if time is None else time.value

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int | float) and not isinstance(other, bool):
            return self.value == other
        try:
            time = self._other(other)
        except ValueError:
            return False
        if time is None:
            return NotImplemented
        return self.unit == time.unit and self.value == time.value

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash(self.value)

    def __lt__(self, other: object) -> bool:
        value = self._compared(other)
        return NotImplemented if value is None else self.value < value

    def __le__(self, other: object) -> bool:
        value = self._compared(other)
        return NotImplemented if value is None else self.value <= value

    def __gt__(self, other: object) -> bool:
        value = self._compared(other)
        return NotImplemented if value is None else self.value > value

    def __ge__(self, other: object) -> bool:
        value = self._compared(other)
        return NotImplemented if value is None else self.value >= value

    def __add__(self, other: object) -> Time:
        time = self._same_unit(other, "add")
        return NotImplemented if time is None else Time(self.value + time.value, self.unit)

    def __radd__(self, other: object) -> Time:
        # 0 + Time works, so sum() of Times works.
        return self.__add__(other)

    def __sub__(self, other: object) -> Time:
        time = self._same_unit(other, "subtract")
        if time is None:
            return NotImplemented
        return self._make(self.value - time.value, f"{self} - {time}")

    def __rsub__(self, other: object) -> Time:
        time = self._same_unit(other, "subtract")
        if time is None:
            return NotImplemented
        return self._make(time.value - self.value, f"{time} - {self}")

    def __mod__(self, other: object) -> Time:
        time = self._same_unit(other, "take the remainder of")
        return NotImplemented if time is None else Time(self.value % time.value, self.unit)

    def __mul__(self, other: object) -> Time:
        if isinstance(other, int | float) and not isinstance(other, bool):
            return self._make(self.value * other, f"{self} * {other}")
        time = self._other(other)
        if time is None:
            return NotImplemented
        if time.unit == TimeUnit.DURATION:
            return self._make(self.value * time.value, f"{self} * {time}")
        if self.unit == TimeUnit.DURATION:
            return time._make(self.value * time.value, f"{self} * {time}")
        raise TypeError(
            f"cannot multiply {self} by {time}: one side must be a number or a fraction in "
            "'dur' (e.g. Time('10ep') * 0.5 or Time('10ep') * '0.5dur')"
        )

    def __rmul__(self, other: object) -> Time:
        return self.__mul__(other)

    def __truediv__(self, other: object) -> Time:
        if isinstance(other, int | float) and not isinstance(other, bool):
            return self._make(self.value / other, f"{self} / {other}")
        time = self._same_unit(other, "divide")
        if time is None:
            return NotImplemented
        return Time(self.value / time.value, TimeUnit.DURATION)

    def __float__(self) -> float:
        return float(self.value)

    def __int__(self) -> int:
        return int(self.value)


def _unit_name(unit: TimeUnit) -> str:
    names = {**_INTEGRAL_UNITS, TimeUnit.DURATION: "fraction of max_duration"}
    return names.get(unit, "seconds")


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


class Timestamp(NamedTuple):
    """Where the run is. Immutable: the loop replaces it with `to_next_batch` / `to_next_epoch`.

    Sample and token counts are global (summed over ranks); wall-clock times are seconds.
    In ``fit``, as in Composer, a batch's time runs from the end of the one before (or the
    start of the loop): loading it, its events, checkpoints, not evaluation.
    A named tuple, so that the loop makes a new one per batch at the cost of one tuple
    (a frozen dataclass costs ten attribute sets); ``Timestamp._fields`` names the fields.
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
        """The count in ``unit`` (epochs, batches, samples, tokens or seconds).

        Raises:
            ValueError: for ``dur`` (see `State.elapsed_fraction`) and ``iter`` (not counted).
        """
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
        if unit == TimeUnit.ITERATION:
            raise ValueError(
                "trainkit does not count iterations ('iter', Composer's group of epochs): a "
                f"run is one iteration; give the time in {_COUNTED}"
            )
        raise ValueError(f"unknown time unit {unit!r}; use one of {[u.value for u in TimeUnit]}")

    def to_next_batch(self, samples: int, tokens: int = 0, duration: float = 0.0) -> Timestamp:
        # The constructor, not _replace: this runs every batch, and _replace costs ~4x more.
        return Timestamp(
            epoch=self.epoch,
            batch=self.batch + 1,
            sample=self.sample + samples,
            token=self.token + tokens,
            batch_in_epoch=self.batch_in_epoch + 1,
            sample_in_epoch=self.sample_in_epoch + samples,
            token_in_epoch=self.token_in_epoch + tokens,
            total_wct=self.total_wct + duration,
            epoch_wct=self.epoch_wct + duration,
            batch_wct=duration,
        )

    def to_next_epoch(self) -> Timestamp:
        return self._replace(
            epoch=self.epoch + 1,
            batch_in_epoch=0,
            sample_in_epoch=0,
            token_in_epoch=0,
            epoch_wct=0.0,
        )

    def state_dict(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Timestamp:
        fields = set(cls._fields)
        unknown = set(state) - fields
        if unknown:
            raise ValueError(
                f"unknown Timestamp fields {sorted(unknown)}; expected {sorted(fields)}"
            )
        return cls(**{k: (v.item() if hasattr(v, "item") else v) for k, v in state.items()})
