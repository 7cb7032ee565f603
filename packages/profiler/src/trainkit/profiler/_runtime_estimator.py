"""`RuntimeEstimator`: how long until the run reaches its ``max_duration``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from trainkit.core import Callback, Event, Logger, State

__all__ = ["RuntimeEstimator", "RuntimeEstimatorConfig"]


@dataclass(kw_only=True)
class RuntimeEstimatorConfig:
    skip_batches: int = 1
    """Batches at the start of each `fit` left out of the pace (start-up, compilation)."""

    def __post_init__(self) -> None:
        skip = self.skip_batches
        if isinstance(skip, bool) or not isinstance(skip, int) or skip < 0:
            raise ValueError(f"skip_batches {self.skip_batches} is not valid; use 0 or more")


class RuntimeEstimator(Callback, config=RuntimeEstimatorConfig):
    """Logs ``time/remaining_sec`` (estimate) and ``time/elapsed_sec`` after every batch.

    The estimate extrapolates the wall-clock pace of this `fit` call, evaluations
    included, from its first batches after ``skip_batches`` (start-up, compilation and
    warm-up are not typical) to the rest of ``max_duration``. A resumed run starts its own
    measurement. Nothing is logged while the run has no ``max_duration``. Options:
    `RuntimeEstimatorConfig`.
    """

    config: RuntimeEstimatorConfig
    required_events = (Event.FIT_START,)

    def __init__(self, config: RuntimeEstimatorConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._fit_started = 0.0
        self._seen = 0
        self._origin: tuple[float, float] | None = None

    def fit_start(self, state: State, logger: Logger) -> None:
        self._fit_started = time.perf_counter()
        self._seen = 0
        self._origin = None
        if self.config.skip_batches == 0 and state.max_duration is not None:
            self._origin = (self._fit_started, state.elapsed_fraction())

    def batch_end(self, state: State, logger: Logger) -> None:
        if state.max_duration is None:
            return
        now = time.perf_counter()
        self._seen += 1
        fraction = state.elapsed_fraction()
        if self._origin is None:
            if self._seen >= self.config.skip_batches:
                self._origin = (now, fraction)
            return
        started, fraction_then = self._origin
        if fraction <= fraction_then:
            return
        remaining = (now - started) / (fraction - fraction_then) * max(1.0 - fraction, 0.0)
        logger.log_metrics(
            {"time/remaining_sec": remaining, "time/elapsed_sec": now - self._fit_started}
        )
