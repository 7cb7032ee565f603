"""Plain progress lines: what the Trainer prints when trainkit-loggers is not installed."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from trainkit.core._callback import Callback
from trainkit.core._destination import LoggerDestination
from trainkit.core._time import TimeUnit

if TYPE_CHECKING:
    from trainkit.core._logger import Logger
    from trainkit.core._state import State

__all__ = ["ProgressLines", "ProgressLinesConfig"]


@dataclass(kw_only=True)
class ProgressLinesConfig:
    interval: int | None = None
    """Batches between lines (default: about ten per epoch)."""
    stream: IO[str] | None = None
    """Where to print (default: standard output). Set from code only."""

    def __post_init__(self) -> None:
        if self.interval is not None and (
            isinstance(self.interval, bool)
            or not isinstance(self.interval, int)
            or self.interval < 1
        ):
            raise ValueError(
                f"progress interval {self.interval!r} is not valid; use a number of batches >= 1, "
                "or None for about ten lines per epoch"
            )


class ProgressLines(Callback, LoggerDestination, config=ProgressLinesConfig):
    """One line every ``interval`` batches (default: ~10 per epoch) and after each eval, rank 0 only."""

    config: ProgressLinesConfig

    def __init__(self, config: ProgressLinesConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._latest: dict[str, Any] = {}

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        self._latest.update(metrics)

    def batch_end(self, state: State, logger: Logger) -> None:
        interval = self.config.interval or max(1, (state.dataloader_len or 500) // 10)
        if state.rank != 0 or (state.timestamp.batch % interval and not state.is_done()):
            return
        self._print(f"[{_where(state)}] " + self._format("loss/train"))

    def eval_after_all(self, state: State, logger: Logger) -> None:
        if state.rank == 0:
            line = self._format("metrics/", exclude="metrics/train/")
            self._print(f"[eval at batch {state.timestamp.batch}] {line}")

    eval_standalone_end = eval_after_all  # Trainer.eval()

    def _format(self, prefix: str, exclude: str | None = None) -> str:
        return "  ".join(
            f"{k}: {float(v):.4f}"
            for k, v in self._latest.items()
            if k.startswith(prefix) and not (exclude and k.startswith(exclude))
        )

    def _print(self, line: str) -> None:
        print(line, file=self.config.stream or sys.stdout, flush=True)


def _where(state: State) -> str:
    """Where the run is: within its budget when it ends on one (seconds, batches, tokens,
    samples: usually inside an epoch), else within the epoch."""
    ts, duration = state.timestamp, state.max_duration
    if duration is not None and duration.unit is not TimeUnit.EPOCH:
        return f"batch {ts.batch}, {min(state.elapsed_fraction(), 1.0):.0%} of {duration}"
    of = f"/{state.dataloader_len}" if state.dataloader_len else ""
    return f"epoch {ts.epoch} batch {ts.batch_in_epoch}{of}"
