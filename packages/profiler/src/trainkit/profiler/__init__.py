"""trainkit.profiler: a torch.profiler callback and monitors for speed, memory and the system.

Every component is a callback registered under the ``trainkit.callbacks`` entry points:
``profiler``, ``speed_monitor``, ``memory_monitor``, ``system_metrics_monitor``,
``runtime_estimator``, ``memory_snapshot``, ``oom_observer``. Each is configured by its config dataclass
(``SpeedMonitor(SpeedMonitorConfig(window_size=50))`` or ``SpeedMonitor(window_size=50)``).

The names below are imported on first use (PEP 562), so loading one entry point imports
its own module only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainkit.core.plugins import lazy_exports

if TYPE_CHECKING:
    from trainkit.profiler._memory_monitor import MemoryMonitor, MemoryMonitorConfig
    from trainkit.profiler._memory_snapshot import MemorySnapshot, MemorySnapshotConfig
    from trainkit.profiler._oom_observer import OOMObserver, OOMObserverConfig
    from trainkit.profiler._peak_flops import PEAK_FLOPS, device_peak_flops, peak_flops_for
    from trainkit.profiler._profiler import Profiler, ProfilerConfig
    from trainkit.profiler._runtime_estimator import RuntimeEstimator, RuntimeEstimatorConfig
    from trainkit.profiler._speed_monitor import SpeedMonitor, SpeedMonitorConfig
    from trainkit.profiler._system_monitor import (
        SystemMetricsMonitor,
        SystemMetricsMonitorConfig,
        nvml_metrics,
    )
    from trainkit.profiler._trace import merge_chrome_traces

_MODULES = {
    "PEAK_FLOPS": "_peak_flops",
    "MemoryMonitor": "_memory_monitor",
    "MemoryMonitorConfig": "_memory_monitor",
    "MemorySnapshot": "_memory_snapshot",
    "MemorySnapshotConfig": "_memory_snapshot",
    "OOMObserver": "_oom_observer",
    "OOMObserverConfig": "_oom_observer",
    "Profiler": "_profiler",
    "ProfilerConfig": "_profiler",
    "RuntimeEstimator": "_runtime_estimator",
    "RuntimeEstimatorConfig": "_runtime_estimator",
    "SpeedMonitor": "_speed_monitor",
    "SpeedMonitorConfig": "_speed_monitor",
    "SystemMetricsMonitor": "_system_monitor",
    "SystemMetricsMonitorConfig": "_system_monitor",
    "device_peak_flops": "_peak_flops",
    "merge_chrome_traces": "_trace",
    "nvml_metrics": "_system_monitor",
    "peak_flops_for": "_peak_flops",
}

__all__ = [
    "PEAK_FLOPS",
    "MemoryMonitor",
    "MemoryMonitorConfig",
    "MemorySnapshot",
    "MemorySnapshotConfig",
    "OOMObserver",
    "OOMObserverConfig",
    "Profiler",
    "ProfilerConfig",
    "RuntimeEstimator",
    "RuntimeEstimatorConfig",
    "SpeedMonitor",
    "SpeedMonitorConfig",
    "SystemMetricsMonitor",
    "SystemMetricsMonitorConfig",
    "device_peak_flops",
    "merge_chrome_traces",
    "nvml_metrics",
    "peak_flops_for",
]


__getattr__, __dir__ = lazy_exports(__name__, _MODULES)
