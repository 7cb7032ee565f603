"""SpeedMonitor, MemoryMonitor, SystemMetricsMonitor and RuntimeEstimator through a Trainer."""

import types

import psutil
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from toy import blobs, loader, mlp
from trainkit.core import Callback, LoggerDestination
from trainkit.profiler import (
    MemoryMonitor,
    RuntimeEstimator,
    SpeedMonitor,
    SystemMetricsMonitor,
    _runtime_estimator,
    _speed_monitor,
    nvml_metrics,
    peak_flops_for,
)
from trainkit.trainer import Trainer


class Memory(LoggerDestination):
    def __init__(self):
        self.logged = []

    def log_metrics(self, metrics, step):
        self.logged.append((step, dict(metrics)))

    def last(self, key):
        return [m[key] for _, m in self.logged if key in m][-1]

    def steps(self, key):
        return [s for s, m in self.logged if key in m]


class FakeClock(Callback):
    """perf_counter advances 1 s per training batch and 100 s per evaluation."""

    def __init__(self, monkeypatch, *modules):
        self.now = 0.0
        for module in modules:
            monkeypatch.setattr(module.time, "perf_counter", lambda: self.now)

    def batch_start(self, state, logger):
        self.now += 1.0

    def eval_start(self, state, logger):
        self.now += 100.0


def _fit(*callbacks, model=None, duration="8ba", **kwargs):
    memory = Memory()
    trainer = Trainer(
        model=model or mlp(),
        train_dataloader=loader(blobs(64)),  # 4 batches of 16
        max_duration=duration,
        device="cpu",
        progress_bar=False,
        seed=0,
        callbacks=list(callbacks),
        loggers=[memory],
        **kwargs,
    )
    trainer.fit()
    trainer.close()
    return memory


class WithFlops(type(mlp())):
    def flops_per_batch(self, batch):
        return 1000.0 * batch[0].shape[0]


def test_throughput_over_a_window_without_evaluation_time(monkeypatch):
    clock = FakeClock(monkeypatch, _speed_monitor)
    model = WithFlops(mlp().module, num_classes=2)
    memory = _fit(
        clock,
        SpeedMonitor(window_size=3, peak_flops=64_000.0),
        model=model,
        eval_dataloader=loader(blobs(16)),
        eval_interval="2ba",
    )
    assert memory.steps("throughput/samples_per_sec") == [2, 3, 4, 5, 6, 7, 8]
    assert memory.last("throughput/batches_per_sec") == pytest.approx(1.0)
    assert memory.last("throughput/samples_per_sec") == pytest.approx(16.0)
    assert memory.last("throughput/device/samples_per_sec") == pytest.approx(16.0)
    assert memory.last("throughput/device/flops_per_sec") == pytest.approx(16_000.0)
    assert memory.last("throughput/flops_per_sec") == pytest.approx(16_000.0)
    assert memory.last("throughput/device/mfu") == pytest.approx(0.25)
    assert all("throughput/tokens_per_sec" not in m for _, m in memory.logged)


def test_flops_are_measured_once_when_the_model_does_not_say(monkeypatch):
    model = mlp(features=8, hidden=16, dropout=0.0)
    batch = next(iter(loader(blobs(64))))
    with FlopCounterMode(display=False) as counter:
        model.loss(model(batch), batch).backward()
    expected_per_batch = counter.get_total_flops()
    assert expected_per_batch > 0

    clock = FakeClock(monkeypatch, _speed_monitor)
    memory = _fit(clock, SpeedMonitor(window_size=2), model=model)
    assert memory.last("throughput/device/flops_per_sec") == pytest.approx(expected_per_batch)
    assert all("throughput/device/mfu" not in m for _, m in memory.logged)  # no peak on CPU


def test_tokens_per_second_for_token_batches(monkeypatch):
    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            return {"input_ids": torch.zeros(5, dtype=torch.long), "y": torch.tensor(i % 2)}

    class TokenModel(type(mlp())):
        def forward(self, batch):
            return self.module(batch["input_ids"].float())

        def loss(self, outputs, batch):
            return torch.nn.functional.cross_entropy(outputs, batch["y"])

    clock = FakeClock(monkeypatch, _speed_monitor)
    model = TokenModel(torch.nn.Linear(5, 2), train_metrics={})
    memory = Memory()
    Trainer(
        model=model, train_dataloader=torch.utils.data.DataLoader(Tokens(), batch_size=8),
        max_duration="4ba", device="cpu", progress_bar=False, callbacks=[clock, SpeedMonitor()],
        loggers=[memory],
    ).fit()  # fmt: skip
    assert memory.last("throughput/tokens_per_sec") == pytest.approx(40.0)


def test_peak_flops_table():
    assert peak_flops_for("NVIDIA H100 80GB HBM3", "amp_bf16") == 989.4e12
    assert peak_flops_for("NVIDIA H100 PCIe", "amp_fp16") == 756e12
    assert peak_flops_for("NVIDIA A100-SXM4-40GB", "amp_bf16") == 312e12
    assert peak_flops_for("NVIDIA A10", "amp_bf16") == 125e12
    assert peak_flops_for("Tesla T4", "amp_fp16") == 65e12
    assert peak_flops_for("Tesla V100-SXM2-16GB", "amp_bf16") is None  # no bf16 on V100
    assert peak_flops_for("Some New GPU", "fp32") is None
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert peak_flops_for("NVIDIA A100 80GB PCIe", "fp32") == 19.5e12
        torch.set_float32_matmul_precision("high")
        assert peak_flops_for("NVIDIA A100 80GB PCIe", "fp32") == 156e12  # TF32 matmuls
    finally:
        torch.set_float32_matmul_precision(previous)


def test_peak_flops_of_the_runs_precision_object():
    from trainkit.core import MixedPrecision, Precision

    h100 = "NVIDIA H100 80GB HBM3"
    assert peak_flops_for(h100, MixedPrecision("cpu", torch.bfloat16)) == 989.4e12
    assert peak_flops_for(h100, MixedPrecision("cpu", torch.float16)) == 989.4e12

    class SomeStrategysPrecision(Precision):  # keyed by what it computes in, not its name
        name = "fsdp_mixed"

        @property
        def autocast_dtype(self):
            return torch.bfloat16

    assert peak_flops_for(h100, SomeStrategysPrecision()) == 989.4e12
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert peak_flops_for(h100, Precision()) == 67e12
    finally:
        torch.set_float32_matmul_precision(previous)
    with pytest.raises(ValueError, match="unknown precision 'bf16'; accepted: 'fp32', "):
        peak_flops_for(h100, "bf16")


def test_samples_are_counted_once_per_data_parallel_group(monkeypatch):
    """FLOPs per rank come from the run's data-parallel size (ranks sharing a batch count it
    once), which core computes from the strategy: here one process claims two data streams."""
    from trainkit.core import SingleProcess

    class TwoStreams(SingleProcess):
        @property
        def data_parallel_size(self):
            return 2

    model = mlp(features=8, hidden=16, dropout=0.0)
    batch = next(iter(loader(blobs(64))))
    with FlopCounterMode(display=False) as counter:
        model.loss(model(batch), batch).backward()
    clock = FakeClock(monkeypatch, _speed_monitor)
    memory = _fit(clock, SpeedMonitor(window_size=2), model=model, parallelism=TwoStreams())
    assert memory.last("throughput/samples_per_sec") == pytest.approx(32.0)  # 16 x 2 streams
    assert memory.last("throughput/device/flops_per_sec") == pytest.approx(
        counter.get_total_flops()
    )


def test_bad_speed_monitor_arguments():
    with pytest.raises(ValueError, match="window_size 0 is not valid"):
        SpeedMonitor(window_size=0)
    with pytest.raises(ValueError, match="peak_flops -1 is not valid"):
        SpeedMonitor(peak_flops=-1)


def test_memory_monitor_reports_process_memory_on_cpu():
    memory = _fit(MemoryMonitor(interval="2ba"), duration="5ba")
    assert memory.steps("memory/rss_gib") == [2, 4]
    rss, peak = memory.last("memory/rss_gib"), memory.last("memory/peak_rss_gib")
    # The peak in GiB (KiB from getrusage on Linux): at least what is resident now, and
    # no more than the machine holds.
    assert 0.01 < rss <= peak < psutil.virtual_memory().total / 2**30
    assert not any("memory/allocated_gib" in m for _, m in memory.logged)


def test_memory_monitor_never_reports_a_peak_under_the_current_size(monkeypatch):
    # getrusage's peak can lag the resident size by a few MiB (approximate per-CPU
    # counters; seen on a 16-core machine): the peak reported is then the current size.
    from trainkit.profiler import _memory_monitor

    monkeypatch.setattr(_memory_monitor, "_peak_rss_bytes", lambda: 1024)
    figures = MemoryMonitor().measure(torch.device("cpu"))
    assert figures["memory/peak_rss_gib"] == figures["memory/rss_gib"] > 0.01


def test_system_metrics_monitor():
    memory = _fit(SystemMetricsMonitor(interval="2ba"), duration="4ba")
    assert memory.steps("system/cpu_percent") == [2, 4]
    last = [m for _, m in memory.logged if "system/cpu_percent" in m][-1]
    assert 0.0 <= last["system/cpu_percent"] <= 100.0
    assert 0.0 < last["system/memory_percent"] < 100.0
    assert 0.0 < last["system/disk_percent"] <= 100.0
    assert not any(key.startswith("system/gpu") for key in last)


def test_nvml_figures():
    nvml = types.SimpleNamespace(
        NVML_TEMPERATURE_GPU=0,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=87, memory=40),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=20, total=80),
        nvmlDeviceGetTemperature=lambda h, sensor: 61,
        nvmlDeviceGetPowerUsage=lambda h: 312_500,
    )
    assert nvml_metrics(nvml, handle=object()) == {
        "system/gpu_percent": 87.0,
        "system/gpu_memory_busy_percent": 40.0,
        "system/gpu_memory_used_percent": 25.0,
        "system/gpu_temperature_c": 61.0,
        "system/gpu_power_w": 312.5,
    }


def test_runtime_estimate(monkeypatch):
    clock = FakeClock(monkeypatch, _runtime_estimator)
    memory = _fit(clock, RuntimeEstimator(skip_batches=1), duration="2ep")
    # 1 s per batch, 8 batches: after batch b (b >= 2) there are 8 - b seconds left.
    remaining = [
        (s, m["time/remaining_sec"]) for s, m in memory.logged if "time/remaining_sec" in m
    ]
    assert remaining == [(b, pytest.approx(8.0 - b)) for b in range(2, 9)]
    assert memory.last("time/elapsed_sec") == pytest.approx(8.0)


def test_train_val_and_total_time_as_composer(monkeypatch):
    """1 s per batch and 100 s per evaluation (every 2 batches, after BATCH_END)."""
    clock = FakeClock(monkeypatch, _speed_monitor)
    memory = _fit(
        clock,
        SpeedMonitor(window_size=2, time_unit="seconds"),
        eval_dataloader=loader(blobs(16)),
        eval_interval="2ba",
    )
    assert memory.steps("time/train") == list(range(1, 9))  # from the first batch on
    for step, metrics in memory.logged:
        if "time/train" in metrics:
            evals_before = (step - 1) // 2
            assert metrics["time/train"] == pytest.approx(step)
            assert metrics["time/val"] == pytest.approx(100.0 * evals_before)
            assert metrics["time/total"] == pytest.approx(step + 100.0 * evals_before)
    assert memory.last("throughput/batches_per_sec") == pytest.approx(1.0)
    assert memory.last("throughput/device/batches_per_sec") == pytest.approx(1.0)


def test_time_is_in_hours_by_default_and_survives_a_resume(monkeypatch):
    clock = FakeClock(monkeypatch, _speed_monitor)
    first = SpeedMonitor()
    _fit(clock, first, duration="4ba")
    saved = first.state_dict()
    assert saved == {"train_seconds": pytest.approx(4.0), "eval_seconds": 0.0}

    resumed = SpeedMonitor()
    resumed.load_state_dict(saved)
    memory = _fit(clock, resumed, duration="3ba")
    assert memory.last("time/train") == pytest.approx((4.0 + 3.0) / 3600)
    assert memory.last("time/total") == pytest.approx((4.0 + 3.0) / 3600)


def test_standalone_evaluation_counts_as_validation_time(monkeypatch):
    clock = FakeClock(monkeypatch, _speed_monitor)
    monitor = SpeedMonitor(time_unit="minutes")
    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(64)),
        eval_dataloader=loader(blobs(16)),
        max_duration="2ba",
        eval_interval="100ba",  # only the evaluation at the end of training
        device="cpu",
        progress_bar=False,
        callbacks=[clock, monitor],
    )
    trainer.fit()
    trainer.eval()
    assert monitor.state_dict() == {"train_seconds": 2.0, "eval_seconds": 200.0}


def test_bad_time_unit():
    with pytest.raises(ValueError, match="time_unit 'weeks' is not known; use one of 'seconds'"):
        SpeedMonitor(time_unit="weeks")
