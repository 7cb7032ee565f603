"""`MemoryMonitor`: the device allocator's statistics and the process's resident memory."""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from trainkit.core import Callback, Event, Logger, State, Time
from trainkit.core.interval import interval_trigger

__all__ = ["MemoryMonitor", "MemoryMonitorConfig"]

_GIB = 2**30
# CUDA caching allocator statistics worth watching, and the names they are logged under.
_CUDA_STATS = {
    "allocated_bytes.all.current": "memory/allocated_gib",
    "allocated_bytes.all.peak": "memory/peak_allocated_gib",
    "active_bytes.all.current": "memory/active_gib",
    "reserved_bytes.all.current": "memory/reserved_gib",
    "reserved_bytes.all.peak": "memory/peak_reserved_gib",
    "num_alloc_retries": "memory/alloc_retries",
    "num_ooms": "memory/ooms",
}


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


@dataclass(kw_only=True)
class MemoryMonitorConfig:
    interval: str | int | Time = "10ba"
    """How often to measure: ``"10ba"``, ``"1ba"``, ``"1ep"``, ..."""

    def __post_init__(self) -> None:
        interval_trigger(self.interval)  # raises ValueError unless it is a duration


class MemoryMonitor(Callback, config=MemoryMonitorConfig):
    """Logs memory use at the end of a batch, every ``interval``.

    On CUDA, the caching allocator's statistics (``torch.cuda.memory_stats``; host-side
    counters, no device sync): allocated, active and reserved GiB, their peaks since the
    start, allocation retries (a sign of fragmentation) and out-of-memory count. On MPS,
    the allocated and driver GiB. Always, the process's resident set size and its peak
    (``memory/rss_gib``, ``memory/peak_rss_gib``), via psutil. Options: `MemoryMonitorConfig`.
    """

    config: MemoryMonitorConfig

    def __init__(self, config: MemoryMonitorConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._trigger = interval_trigger(self.config.interval, at_end=False)
        self._process = psutil.Process()

    def batch_end(self, state: State, logger: Logger) -> None:
        if self._trigger(state, Event.BATCH_END):
            logger.log_metrics(self.measure(state.device))

    def epoch_end(self, state: State, logger: Logger) -> None:
        if self._trigger(state, Event.EPOCH_END):
            logger.log_metrics(self.measure(state.device))

    def measure(self, device: torch.device) -> dict[str, Any]:
        """The memory figures now, for ``device``."""
        rss = self._process.memory_info().rss
        # The kernel sums both from per-CPU counters it reads approximately, so the peak can
        # come out a few MiB under the current size on many-core machines: a peak is never
        # less than what is resident now.
        metrics: dict[str, Any] = {
            "memory/rss_gib": rss / _GIB,
            "memory/peak_rss_gib": max(_peak_rss_bytes(), rss) / _GIB,
        }
        if device.type == "cuda":
            stats = torch.cuda.memory_stats(device)
            for stat, key in _CUDA_STATS.items():
                value = stats.get(stat, 0)
                metrics[key] = value / _GIB if key.endswith("_gib") else value
        elif device.type == "mps":
            metrics["memory/allocated_gib"] = torch.mps.current_allocated_memory() / _GIB
            metrics["memory/driver_gib"] = torch.mps.driver_allocated_memory() / _GIB
        return metrics
