"""Every trainkit-profiler component is found by entry point name."""

import ast
from pathlib import Path

import pytest

import trainkit.profiler as profiler
from trainkit.core import plugins

CALLBACKS = {
    "profiler": profiler.Profiler,
    "speed_monitor": profiler.SpeedMonitor,
    "memory_monitor": profiler.MemoryMonitor,
    "system_metrics_monitor": profiler.SystemMetricsMonitor,
    "runtime_estimator": profiler.RuntimeEstimator,
    "memory_snapshot": profiler.MemorySnapshot,
    "oom_observer": profiler.OOMObserver,
}


@pytest.mark.parametrize("name", sorted(CALLBACKS))
def test_entry_points_resolve(name):
    assert plugins.load("trainkit.callbacks", name) is CALLBACKS[name]


def test_entry_points_build_with_their_defaults():
    for name in CALLBACKS:
        plugins.load("trainkit.callbacks", name)()


def test_nvml_is_imported_only_when_used():
    folder = Path(profiler.__file__).parent
    for path in folder.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = (
                    [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                )
                assert "pynvml" not in names, path.name


def test_public_api_is_the_init():
    for name in profiler.__all__:
        assert hasattr(profiler, name)
