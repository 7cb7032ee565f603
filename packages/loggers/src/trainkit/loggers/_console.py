"""`ConsoleLogger`: the latest metrics as plain lines, every so many batches, on rank 0."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from trainkit.core import Callback, Event, Logger, LoggerDestination, State, Time, dist
from trainkit.core.interval import interval_trigger
from trainkit.loggers._common import check_interval, flatten, to_python

__all__ = ["ConsoleLogger", "ConsoleLoggerConfig"]


@dataclass(kw_only=True)
class ConsoleLoggerConfig:
    interval: str | int | Time = "100ba"
    """How often to print the training metrics: ``"100ba"``, ``"1ep"``, ``"0.1dur"``, ...
    (and always at the last batch)."""
    stream: IO[str] | None = None
    """Where to print (default: standard output). Set from code only."""
    print_hyperparameters: bool = True
    """Print the run's configuration once, at the start (nested values as dotted keys)."""

    def __post_init__(self) -> None:
        check_interval(self.interval)


def _is_eval(key: str) -> bool:
    return key.startswith("metrics/") and not key.startswith("metrics/train/")


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.5g}"
    return str(value)


class ConsoleLogger(Callback, LoggerDestination, config=ConsoleLoggerConfig):
    """Prints every metric logged since the last line, every ``interval``, on rank 0 only.

    Training metrics go out as ``[epoch 0 batch 100/400] loss/train/total: 0.6931 ...`` at
    the interval (and at the last batch); evaluation metrics as one ``[eval at batch N]``
    line after each evaluation; each logged table (e.g. the `Generate` callback's samples)
    as a ``[<name> at batch N]`` line and one line per row. Values are converted to
    numbers only when printed.
    Options: `ConsoleLoggerConfig`.
    """

    config: ConsoleLoggerConfig

    def __init__(self, config: ConsoleLoggerConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._trigger = interval_trigger(self.config.interval)
        self.stream = self.config.stream
        self._pending: dict[str, Any] = {}

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        if self.config.print_hyperparameters and dist.get_rank() == 0:
            pairs = "  ".join(f"{k}: {v}" for k, v in flatten(hyperparameters).items())
            self._print(f"[hyperparameters] {pairs}")

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        self._pending.update(metrics)  # sorted out only when printed

    def log_table(
        self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int
    ) -> None:
        if dist.get_rank() != 0:
            return
        self._print(f"[{name} at batch {step}]")
        for row in rows:
            cells = (
                f"{c}: {v!r}" if isinstance(v, str) else f"{c}: {_format(v)}"
                for c, v in zip(columns, row, strict=True)
            )
            self._print("  " + "  ".join(cells))

    def batch_end(self, state: State, logger: Logger) -> None:
        if self._trigger(state, Event.BATCH_END):
            ts, length = state.timestamp, state.dataloader_len
            of = f"/{length}" if length else ""
            self._print_train(state, f"[epoch {ts.epoch} batch {ts.batch_in_epoch}{of}]")

    def epoch_end(self, state: State, logger: Logger) -> None:
        if self._trigger(state, Event.EPOCH_END):
            # The timestamp has already moved to the next epoch.
            self._print_train(state, f"[end of epoch {state.timestamp.epoch - 1}]")

    def eval_after_all(self, state: State, logger: Logger) -> None:
        self._print_some(state, f"[eval at batch {state.timestamp.batch}]", evaluation=True)

    eval_standalone_end = eval_after_all  # Trainer.eval()

    def _print_train(self, state: State, where: str) -> None:
        self._print_some(state, where, evaluation=False)

    def _print_some(self, state: State, where: str, *, evaluation: bool) -> None:
        """Print (on rank 0) and forget the pending training or evaluation metrics."""
        chosen = {k: v for k, v in self._pending.items() if _is_eval(k) == evaluation}
        for key in chosen:
            del self._pending[key]
        if state.rank == 0 and chosen:
            ((_, _, converted),) = to_python([(0, 0.0, chosen)])
            self._print(f"{where} " + "  ".join(f"{k}: {_format(v)}" for k, v in converted.items()))

    def _print(self, line: str) -> None:
        print(line, file=self.stream or sys.stdout, flush=True)
