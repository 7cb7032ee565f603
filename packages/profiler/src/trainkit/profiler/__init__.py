"""trainkit.profiler: a torch.profiler callback and monitors for speed, memory and the system.

Every component is a callback registered under the ``trainkit.callbacks`` entry points:
``profiler``, ``speed_monitor``, ``memory_monitor``, ``system_metrics_monitor``,
``runtime_estimator``.
"""

from trainkit.profiler._memory_monitor import MemoryMonitor
from trainkit.profiler._peak_flops import PEAK_FLOPS, device_peak_flops, peak_flops_for
from trainkit.profiler._profiler import Profiler
from trainkit.profiler._runtime_estimator import RuntimeEstimator
from trainkit.profiler._speed_monitor import SpeedMonitor
from trainkit.profiler._system_monitor import SystemMetricsMonitor, nvml_metrics
from trainkit.profiler._trace import merge_chrome_traces

__all__ = [
    "PEAK_FLOPS",
    "MemoryMonitor",
    "Profiler",
    "RuntimeEstimator",
    "SpeedMonitor",
    "SystemMetricsMonitor",
    "device_peak_flops",
    "merge_chrome_traces",
    "nvml_metrics",
    "peak_flops_for",
]
