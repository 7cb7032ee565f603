"""`ProgressBar`: a one-line bar with ETA and the latest metrics, redrawn in a terminal."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

from trainkit.core import Logger, State, Time, TimeUnit
from trainkit.core.progress import ProgressLines, ProgressLinesConfig

__all__ = ["ProgressBar", "ProgressBarConfig"]


@dataclass(kw_only=True)
class ProgressBarConfig(ProgressLinesConfig):
    """`ProgressLinesConfig` (plain lines every ``interval`` batches when the output is not
    a terminal; ``stream``), plus the terminal's redraw rate."""

    refresh_per_second: float = 4.0
    """At most this many redraws a second in a terminal."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.refresh_per_second, bool) or not (
            isinstance(self.refresh_per_second, int | float) and self.refresh_per_second > 0
        ):
            raise ValueError(
                f"ProgressBar refresh_per_second {self.refresh_per_second!r} is not valid; use "
                "redraws per second > 0"
            )


class ProgressBar(ProgressLines, config=ProgressBarConfig):
    """Progress of the run on rank 0: of its ``max_duration`` (a wall-clock, batch, token
    or sample budget), or with a duration in epochs, of the epoch; and the run's ETA.

    In a terminal the line is redrawn in place (at most ``refresh_per_second`` times a
    second); otherwise it falls back to plain lines every ``interval`` batches, so logs
    captured to files stay readable. Options: `ProgressBarConfig`.
    """

    config: ProgressBarConfig

    def __init__(self, config: ProgressBarConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self.refresh_seconds = 1.0 / self.config.refresh_per_second
        self._last_draw = 0.0
        self._start: tuple[float, float] | None = None
        self._drawn = False
        self._terminal: tuple[IO[str], bool] | None = None  # (stream, whether a terminal)

    @property
    def _out(self) -> IO[str]:
        return self.config.stream or sys.stdout

    def _is_terminal(self) -> bool:
        # Asked every batch: the answer is kept per stream (isatty is a system call).
        out = self._out
        if self._terminal is None or self._terminal[0] is not out:
            self._terminal = (out, bool(getattr(out, "isatty", lambda: False)()))
        return self._terminal[1]

    def fit_start(self, state: State, logger: Logger) -> None:
        self._start = (time.monotonic(), state.elapsed_fraction())

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        self._latest.update(metrics)

    def batch_end(self, state: State, logger: Logger) -> None:
        if not self._is_terminal():
            super().batch_end(state, logger)
            return
        now = time.monotonic()
        if state.rank != 0 or (
            now - self._last_draw < self.refresh_seconds and not state.is_done()
        ):
            return
        self._last_draw = now
        self._draw(self._line(state, now))

    def epoch_end(self, state: State, logger: Logger) -> None:
        self._newline()

    def eval_after_all(self, state: State, logger: Logger) -> None:
        self._newline()
        super().eval_after_all(state, logger)

    eval_standalone_end = eval_after_all  # Trainer.eval()

    def fit_end(self, state: State, logger: Logger) -> None:
        self._newline()

    def _line(self, state: State, now: float) -> str:
        ts, length, duration = state.timestamp, state.dataloader_len, state.max_duration
        if duration is not None and duration.unit is not TimeUnit.EPOCH:
            # The run ends on its budget (seconds, batches, tokens, ...), usually inside an
            # epoch: the bar counts the budget, so it is full when the run ends.
            done = min(state.elapsed_fraction(), 1.0)
            where = f"[{_bar(done)}] {done:4.0%} of {_budget(duration)}, batch {ts.batch}"
        elif length:
            done = min(ts.batch_in_epoch / length, 1.0)
            where = f"epoch {ts.epoch} [{_bar(done)}] {ts.batch_in_epoch}/{length}"
        else:
            where = f"epoch {ts.epoch} batch {ts.batch_in_epoch}"
        return f"{where} {self._eta(state, now)} {self._format('loss/train')}"

    def _eta(self, state: State, now: float) -> str:
        if self._start is None:
            return ""
        started, fraction_then = self._start
        fraction = state.elapsed_fraction()
        if fraction <= fraction_then:
            return "ETA --:--"
        remaining = (now - started) / (fraction - fraction_then) * max(1.0 - fraction, 0.0)
        minutes, seconds = divmod(int(remaining), 60)
        hours, minutes = divmod(minutes, 60)
        return (
            f"ETA {hours}:{minutes:02d}:{seconds:02d}"
            if hours
            else f"ETA {minutes:02d}:{seconds:02d}"
        )

    def _draw(self, line: str) -> None:
        columns = shutil.get_terminal_size((100, 20)).columns
        self._out.write("\r" + line[: columns - 1].ljust(columns - 1))
        self._out.flush()
        self._drawn = True

    def _newline(self) -> None:
        if self._drawn:
            self._out.write("\n")
            self._out.flush()
            self._drawn = False


def _bar(done: float, width: int = 20) -> str:
    filled = round(done * width)
    return "#" * filled + "." * (width - filled)


def _budget(duration: Time) -> str:
    """``max_duration`` as a reader says it: ``230 s``, ``500ba``, ``0.5dur``."""
    if duration.unit is TimeUnit.SECOND:
        return f"{duration.value:g} s"
    return str(duration)
