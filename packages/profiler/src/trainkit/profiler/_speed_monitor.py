"""`SpeedMonitor`: throughput over a window of batches, FLOP/s and model FLOPs utilisation."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from trainkit.core import Callback, Event, Logger, State
from trainkit.profiler._peak_flops import device_peak_flops

__all__ = ["SpeedMonitor", "SpeedMonitorConfig"]


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

    def __post_init__(self) -> None:
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

    Keys: ``throughput/batches_per_sec``, ``throughput/samples_per_sec`` (all ranks),
    ``throughput/device/samples_per_sec`` (per rank), the same for tokens when batches
    have tokens, ``throughput/flops_per_sec`` and ``throughput/device/flops_per_sec``
    when FLOPs are known, and ``throughput/device/mfu`` when the device's peak is known.

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

    def fit_start(self, state: State, logger: Logger) -> None:
        self._window.clear()  # the time between two fit() calls is not training
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
            self._excluded += time.perf_counter() - self._eval_started
            self._eval_started = None

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
        now = time.perf_counter() - self._excluded
        self._window.append(_Point(now, ts.batch, ts.sample, ts.token, self._flops))
        if len(self._window) < 2:
            return
        first, last = self._window[0], self._window[-1]
        seconds = last.seconds - first.seconds
        if seconds <= 0:
            return
        world = self._world
        samples = (last.samples - first.samples) / seconds
        metrics = {
            "throughput/batches_per_sec": (last.batches - first.batches) / seconds,
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
