"""`SystemMetricsMonitor`: CPU, memory, disk and (with NVML) GPU utilisation."""

from __future__ import annotations

import importlib.util
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

from trainkit.core import Callback, Event, Logger, State, Time
from trainkit.core.interval import interval_trigger

__all__ = ["SystemMetricsMonitor", "SystemMetricsMonitorConfig", "nvml_metrics"]

_MIB = 2**20


def nvml_metrics(nvml: Any, handle: Any) -> dict[str, float]:
    """One GPU's utilisation, memory, temperature and power, read through NVML."""
    utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    return {
        "system/gpu_percent": float(utilization.gpu),
        "system/gpu_memory_busy_percent": float(utilization.memory),
        "system/gpu_memory_used_percent": 100.0 * memory.used / memory.total,
        "system/gpu_temperature_c": float(
            nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        ),
        "system/gpu_power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
    }


def _nvml_handle(nvml: Any, device: torch.device) -> Any:
    # NVML numbers all GPUs of the machine; the PCI address names the one torch uses,
    # whatever CUDA_VISIBLE_DEVICES says.
    props = torch.cuda.get_device_properties(device)
    bus_id = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    return nvml.nvmlDeviceGetHandleByPciBusId(bus_id)


@dataclass(kw_only=True)
class SystemMetricsMonitorConfig:
    interval: str | int | Time = "10ba"
    """How often to measure: ``"10ba"``, ``"100ba"``, ``"1ep"``, ..."""
    disk_path: str | Path = "."
    """A path on the disk whose use is reported (a `Path` is kept as its text)."""
    gpu: bool = True
    """Read GPU figures when the run is on CUDA and NVML is installed."""

    def __post_init__(self) -> None:
        interval_trigger(self.interval)  # raises ValueError unless it is a duration
        self.disk_path = os.fspath(self.disk_path)


class SystemMetricsMonitor(Callback, config=SystemMetricsMonitorConfig):
    """Logs machine utilisation every ``interval`` (on every rank: each sees its own node).

    Keys: ``system/cpu_percent`` (the machine) and ``system/process_cpu_percent`` (this
    process; 100 per busy core), averaged since the previous reading;
    ``system/memory_percent``; ``system/disk_percent`` (the disk holding ``disk_path``);
    ``system/disk_read_mib_per_sec`` / ``..._write_...`` where the OS reports disk I/O.
    On CUDA with NVML (``pip install "trainkit-profiler[gpu]"``, module ``pynvml``):
    ``system/gpu_percent``, ``system/gpu_memory_busy_percent``,
    ``system/gpu_memory_used_percent``, ``system/gpu_temperature_c``, ``system/gpu_power_w``.
    Options: `SystemMetricsMonitorConfig`.
    """

    config: SystemMetricsMonitorConfig

    def __init__(self, config: SystemMetricsMonitorConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._trigger = interval_trigger(self.config.interval, at_end=False)
        self._process = psutil.Process()
        self._nvml: Any = None
        self._handle: Any = None
        self._disk: tuple[float, Any] | None = None

    def fit_start(self, state: State, logger: Logger) -> None:
        psutil.cpu_percent(None)  # start the averaging periods
        self._process.cpu_percent(None)
        self._disk = (time.monotonic(), psutil.disk_io_counters())
        if self.config.gpu and self._handle is None and state.device.type == "cuda":
            self._start_nvml(state.device)

    def _start_nvml(self, device: torch.device) -> None:
        if importlib.util.find_spec("pynvml") is None:
            warnings.warn(
                "SystemMetricsMonitor: no GPU figures, NVML is not installed; install it with "
                'pip install "trainkit-profiler[gpu]"',
                stacklevel=3,
            )
            return
        import pynvml

        pynvml.nvmlInit()
        self._nvml, self._handle = pynvml, _nvml_handle(pynvml, device)

    def batch_end(self, state: State, logger: Logger) -> None:
        if self._trigger(state, Event.BATCH_END):
            logger.log_metrics(self.measure())

    def epoch_end(self, state: State, logger: Logger) -> None:
        if self._trigger(state, Event.EPOCH_END):
            logger.log_metrics(self.measure())

    def measure(self) -> dict[str, float]:
        """The figures now (CPU figures are averages since the previous call)."""
        metrics = {
            "system/cpu_percent": psutil.cpu_percent(None),
            "system/process_cpu_percent": self._process.cpu_percent(None),
            "system/memory_percent": psutil.virtual_memory().percent,
            "system/disk_percent": psutil.disk_usage(str(self.config.disk_path)).percent,
        }
        now, counters = time.monotonic(), psutil.disk_io_counters()
        if self._disk is not None and counters is not None and self._disk[1] is not None:
            then, before = self._disk
            seconds = max(now - then, 1e-9)
            metrics["system/disk_read_mib_per_sec"] = (
                (counters.read_bytes - before.read_bytes) / _MIB / seconds
            )
            metrics["system/disk_write_mib_per_sec"] = (
                (counters.write_bytes - before.write_bytes) / _MIB / seconds
            )
        self._disk = (now, counters)
        if self._handle is not None:
            metrics.update(nvml_metrics(self._nvml, self._handle))
        return metrics

    def close(self, state: State | None = None, logger: Logger | None = None) -> None:
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._nvml = self._handle = None
