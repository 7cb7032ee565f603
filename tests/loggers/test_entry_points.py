"""Every component is found by entry point name; heavy clients are imported only when used."""

import ast
from pathlib import Path

import pytest

import trainkit.loggers as loggers
from trainkit.core import plugins
from trainkit.loggers import plot

DESTINATIONS = {
    "progress": loggers.ProgressBar,
    "console": loggers.ConsoleLogger,
    "file": loggers.FileLogger,
    "in_memory": loggers.InMemoryLogger,
    "wandb": loggers.WandBLogger,
    "tensorboard": loggers.TensorBoardLogger,
    "mlflow": loggers.MLflowLogger,
    "neptune": loggers.NeptuneLogger,
    "comet": loggers.CometLogger,
}
MONITORS = {
    "lr_monitor": loggers.LRMonitor,
    "optimizer_monitor": loggers.OptimizerMonitor,
    "nan_monitor": loggers.NaNMonitor,
    "generate": loggers.Generate,
    "activation_monitor": loggers.ActivationMonitor,
    "image_visualizer": loggers.ImageVisualizer,
}
HEAVY = {
    "wandb",
    "mlflow",
    "tensorboard",
    "matplotlib",
    "torch.utils.tensorboard",
    "neptune",
    "comet_ml",
    "pandas",
    "transformers",
}


@pytest.mark.parametrize("name", sorted(DESTINATIONS))
def test_destination_entry_points_resolve(name):
    assert plugins.load("trainkit.loggers", name) is DESTINATIONS[name]


@pytest.mark.parametrize("name", sorted(MONITORS))
def test_monitor_entry_points_resolve(name):
    assert plugins.load("trainkit.callbacks", name) is MONITORS[name]


def test_plot_command_entry_point_resolves():
    assert plugins.load("trainkit.commands", "plot") is plot.main


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(
        LookupError, match=r"no 'trainkit\.loggers' entry point named 'wandbb'"
    ) as err:
        plugins.load("trainkit.loggers", "wandbb")
    known = "comet, console, file, in_memory, mlflow, neptune, progress, tensorboard, wandb"
    assert known in str(err.value)


def _module_level_imports(path):
    tree = ast.parse(path.read_text())
    for node in tree.body:  # only statements run at import time, not those in functions
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_no_heavy_client_is_imported_with_the_package():
    folder = Path(loggers.__file__).parent
    found = {
        (path.name, module)
        for path in folder.glob("*.py")
        for module in _module_level_imports(path)
        if module.split(".")[0] in HEAVY or module in HEAVY
    }
    assert found == set()


def test_public_api_is_the_init():
    assert sorted(loggers.__all__) == sorted(set(loggers.__all__))
    for name in loggers.__all__:
        assert getattr(loggers, name).__module__.startswith("trainkit.loggers")
