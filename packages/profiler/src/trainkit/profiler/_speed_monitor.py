"""`SpeedMonitor`: throughput over a window of batches, FLOP/s and model FLOPs utilisation."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from trainkit.core import Callback, Event, Logger, State
from trainkit.profiler._peak_flops import device_peak_flops

__all__ = ["SpeedMonitor", "SpeedMonitorConfig"]

_SECONDS_PER = {"seconds": 1.0, "minutes": 60.0, "hours": 3600.0, "days": 86400.0}


class _Point(NamedTuple):
    seconds: float  # training wall time (evaluation excluded)
    batches: int
    samples: int
    tokens: int
    flops: float  # this rank's FLOPs so far


@dataclass(kw_only=True)
class SpeedMonitorConfig:
    window_size: int = 100
    """Batches to average over."""
    peak_flops: float | None = None
    """The device's peak FLOP/s, for MFU (default: looked up from the GPU's name and the
    run's precision in `trainkit.profiler.PEAK_FLOPS`; none on CPU)."""
    measure_flops: bool = True
    """Count FLOPs once, on the first batch, when the model has no ``flops_per_batch``."""
    time_unit: Literal["seconds", "minutes", "hours", "days"] = "hours"
    """The unit of ``time/train``, ``time/val`` and ``time/total`` (Composer's default:
    hours)."""

    def __post_init__(self) -> None:
        if self.time_unit not in _SECONDS_PER:
            raise ValueError(
                f"time_unit {self.time_unit!r} is not known; use one of "
                f"{', '.join(map(repr, _SECONDS_PER))}"
            )
        window = self.window_size
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window_size {self.window_size} is not valid; use 1 or more batches")
        if self.peak_flops is not None and not (
            isinstance(self.peak_flops, int | float)
            and not isinstance(self.peak_flops, bool)
            and self.peak_flops > 0
        ):
            raise ValueError(f"peak_flops {self.peak_flops!r} is not valid; use FLOP/s > 0 or None")


class SpeedMonitor(Callback, config=SpeedMonitorConfig):
    """Logs throughput over the last ``window_size`` batches, after every batch.

    Keys: ``throughput/batches_per_sec`` and ``throughput/samples_per_sec`` (all ranks),
    ``throughput/device/batches_per_sec`` and ``throughput/device/samples_per_sec`` (per
    rank), the same for tokens when batches have tokens, ``throughput/flops_per_sec`` and
    ``throughput/device/flops_per_sec`` when FLOPs are known, and ``throughput/device/mfu``
    when the device's peak is known. Also, after every batch (as Composer's), the run's
    wall-clock time in ``time_unit``: ``time/train`` (training, evaluation excluded),
    ``time/val`` (every evaluation, standalone ones included) and ``time/total`` (their
    sum); these are saved with the run, so a resumed run goes on counting. The time
    between ``fit`` calls (and before a resume) is not counted.

    Time is the host's wall clock between batch ends, without evaluation; nothing waits
    for the device, and over a window the host runs at the device's pace (its launch
    queue is bounded), so the rates are the device's.

    FLOPs per batch come from the model's ``flops_per_batch(batch)`` when it has one
    (FLOPs of forward and backward on one rank's batch; looked up once per `fit`).
    Otherwise, with ``measure_flops``, the first training batch is run under
    ``torch.utils.flop_counter.FlopCounterMode`` (once; it slows that batch) and the
    count per sample is reused for later batches (exact for fixed shapes).

    Options: `SpeedMonitorConfig`.
    """

    config: SpeedMonitorConfig
    required_events = (Event.FIT_START,)

    def __init__(self, config: SpeedMonitorConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._window: collections.deque[_Point] = collections.deque(
            maxlen=self.config.window_size + 1
        )
        self._excluded = 0.0
        self._eval_started: float | None = None
        self._peak: float | None = None
        self._flops_per_sample: float | None = None
        self._counter: Any = None
        self._flops = 0.0
        self._flops_per_batch: Any = None
        self._world = self._streams = 1
        self._samples_in: Any = None
        self._train_seconds = 0.0
        self._eval_seconds = 0.0
        self._mark: float | None = None  # when training time was last counted up to

    def state_dict(self) -> dict[str, Any]:
        return {"train_seconds": self._train_seconds, "eval_seconds": self._eval_seconds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._train_seconds = float(state["train_seconds"])
        self._eval_seconds = float(state["eval_seconds"])

    def fit_start(self, state: State, logger: Logger) -> None:
        self._window.clear()  # the time between two fit() calls is not training
        self._mark = time.perf_counter()
        self._peak = self.config.peak_flops or device_peak_flops(state.device, state.precision)
        # The model's optional FLOPs count: looked up once per fit, not per batch.
        self._flops_per_batch = getattr(
            state.parallelism.unwrap(state.model), "flops_per_batch", None
        )
        self._world = state.world_size
        # Ranks that share their data (tensor parallel) count their samples once.
        self._streams = state.data_parallel_size
        assert state.train_data is not None
        self._samples_in = state.train_data.get_num_samples_in_batch

    def before_train_batch(self, state: State, logger: Logger) -> None:
        if not self.config.measure_flops or self._flops_per_sample is not None:
            return
        if self._flops_per_batch is not None:
            return
        from torch.utils.flop_counter import FlopCounterMode

        if self._counter is not None:  # a retried batch (auto-microbatching): count again
            self._counter.__exit__(None, None, None)
        self._counter = FlopCounterMode(display=False)
        self._counter.__enter__()

    def after_train_batch(self, state: State, logger: Logger) -> None:
        if self._counter is None:
            return
        counter, self._counter = self._counter, None
        counter.__exit__(None, None, None)
        samples = self._samples_in(state.batch)
        self._flops_per_sample = counter.get_total_flops() / max(samples, 1)

    def eval_before_all(self, state: State, logger: Logger) -> None:
        self._eval_started = time.perf_counter()

    def eval_after_all(self, state: State, logger: Logger) -> None:
        if self._eval_started is not None:
            seconds = time.perf_counter() - self._eval_started
            self._excluded += seconds
            self._eval_seconds += seconds
            if self._mark is not None:
                self._mark += seconds  # not training time
            self._eval_started = None

    eval_standalone_start = eval_before_all
    eval_standalone_end = eval_after_all

    def _batch_flops(self, state: State) -> float:
        if self._flops_per_batch is not None:
            return float(self._flops_per_batch(state.batch))
        if self._flops_per_sample and self._window:
            # This rank's samples in the batch, from the global count the loop keeps.
            samples = (state.timestamp.sample - self._window[-1].samples) / self._streams
            return self._flops_per_sample * samples
        return 0.0

    def batch_end(self, state: State, logger: Logger) -> None:
        ts = state.timestamp
        self._flops += self._batch_flops(state)
        clock = time.perf_counter()
        if self._mark is not None:
            self._train_seconds += clock - self._mark
        self._mark = clock
        unit = _SECONDS_PER[self.config.time_unit]
        times = {
            "time/train": self._train_seconds / unit,
            "time/val": self._eval_seconds / unit,
            "time/total": (self._train_seconds + self._eval_seconds) / unit,
        }
        now = clock - self._excluded
        self._window.append(_Point(now, ts.batch, ts.sample, ts.token, self._flops))
        first, last = self._window[0], self._window[-1]
        seconds = last.seconds - first.seconds
        if len(self._window) < 2 or seconds <= 0:
            logger.log_metrics(times)
            return
        world = self._world
        samples = (last.samples - first.samples) / seconds
        batches = (last.batches - first.batches) / seconds
        metrics = {
            **times,
            "throughput/batches_per_sec": batches,
            "throughput/device/batches_per_sec": batches / world,
            "throughput/samples_per_sec": samples,
            "throughput/device/samples_per_sec": samples / world,
        }
        if last.tokens > first.tokens:
            tokens = (last.tokens - first.tokens) / seconds
            metrics["throughput/tokens_per_sec"] = tokens
            metrics["throughput/device/tokens_per_sec"] = tokens / world
        if last.flops > first.flops:
            device_flops = (last.flops - first.flops) / seconds
            metrics["throughput/device/flops_per_sec"] = device_flops
            metrics["throughput/flops_per_sec"] = device_flops * world
            if self._peak:
                metrics["throughput/device/mfu"] = device_flops / self._peak
        logger.log_metrics(metrics)
