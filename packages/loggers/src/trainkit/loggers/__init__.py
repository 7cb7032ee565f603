"""trainkit.loggers: logger destinations and training monitors, found by entry point name.

Destinations (group ``trainkit.loggers``): ``progress``, ``console``, ``file``,
``in_memory``, ``wandb``, ``tensorboard``, ``mlflow``, ``neptune``, ``comet``. Callbacks
(group ``trainkit.callbacks``): ``lr_monitor``, ``optimizer_monitor``, ``nan_monitor``,
``activation_monitor``, ``image_visualizer``, ``generate``. Command
(group ``trainkit.commands``): ``plot``. Each component is configured by its config
dataclass (``FileLogger(FileLoggerConfig(folder="runs/x"))`` or ``FileLogger(folder=...)``).

The names below are imported on first use (PEP 562), so loading one entry point imports
its own module only; heavy clients are imported only when their destination is created.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainkit.core.plugins import lazy_exports

if TYPE_CHECKING:
    from trainkit.loggers._activation_monitor import (
        ActivationMonitor,
        ActivationMonitorConfig,
        activation_stats,
    )
    from trainkit.loggers._comet import CometLogger, CometLoggerConfig
    from trainkit.loggers._console import ConsoleLogger, ConsoleLoggerConfig
    from trainkit.loggers._file import FileLogger, FileLoggerConfig, read_jsonl
    from trainkit.loggers._generate import Generate, GenerateConfig
    from trainkit.loggers._image_visualizer import ImageVisualizer, ImageVisualizerConfig
    from trainkit.loggers._in_memory import InMemoryLogger
    from trainkit.loggers._lr_monitor import LRMonitor, LRMonitorConfig
    from trainkit.loggers._mlflow import MLflowLogger, MLflowLoggerConfig
    from trainkit.loggers._nan_monitor import NaNMonitor, NaNMonitorConfig
    from trainkit.loggers._neptune import NeptuneLogger, NeptuneLoggerConfig
    from trainkit.loggers._optimizer_monitor import (
        OptimizerMonitor,
        OptimizerMonitorConfig,
        l2_norms,
    )
    from trainkit.loggers._progress import ProgressBar, ProgressBarConfig
    from trainkit.loggers._tensorboard import TensorBoardLogger, TensorBoardLoggerConfig
    from trainkit.loggers._wandb import WandBLogger, WandBLoggerConfig

_MODULES = {
    "ActivationMonitor": "_activation_monitor",
    "ActivationMonitorConfig": "_activation_monitor",
    "CometLogger": "_comet",
    "CometLoggerConfig": "_comet",
    "ConsoleLogger": "_console",
    "ConsoleLoggerConfig": "_console",
    "FileLogger": "_file",
    "FileLoggerConfig": "_file",
    "Generate": "_generate",
    "GenerateConfig": "_generate",
    "ImageVisualizer": "_image_visualizer",
    "ImageVisualizerConfig": "_image_visualizer",
    "InMemoryLogger": "_in_memory",
    "LRMonitor": "_lr_monitor",
    "LRMonitorConfig": "_lr_monitor",
    "MLflowLogger": "_mlflow",
    "MLflowLoggerConfig": "_mlflow",
    "NaNMonitor": "_nan_monitor",
    "NaNMonitorConfig": "_nan_monitor",
    "NeptuneLogger": "_neptune",
    "NeptuneLoggerConfig": "_neptune",
    "OptimizerMonitor": "_optimizer_monitor",
    "OptimizerMonitorConfig": "_optimizer_monitor",
    "ProgressBar": "_progress",
    "ProgressBarConfig": "_progress",
    "TensorBoardLogger": "_tensorboard",
    "TensorBoardLoggerConfig": "_tensorboard",
    "WandBLogger": "_wandb",
    "WandBLoggerConfig": "_wandb",
    "activation_stats": "_activation_monitor",
    "l2_norms": "_optimizer_monitor",
    "read_jsonl": "_file",
}

__all__ = [
    "ActivationMonitor",
    "ActivationMonitorConfig",
    "CometLogger",
    "CometLoggerConfig",
    "ConsoleLogger",
    "ConsoleLoggerConfig",
    "FileLogger",
    "FileLoggerConfig",
    "Generate",
    "GenerateConfig",
    "ImageVisualizer",
    "ImageVisualizerConfig",
    "InMemoryLogger",
    "LRMonitor",
    "LRMonitorConfig",
    "MLflowLogger",
    "MLflowLoggerConfig",
    "NaNMonitor",
    "NaNMonitorConfig",
    "NeptuneLogger",
    "NeptuneLoggerConfig",
    "OptimizerMonitor",
    "OptimizerMonitorConfig",
    "ProgressBar",
    "ProgressBarConfig",
    "TensorBoardLogger",
    "TensorBoardLoggerConfig",
    "WandBLogger",
    "WandBLoggerConfig",
    "activation_stats",
    "l2_norms",
    "read_jsonl",
]


# Composer's names that trainkit spells otherwise or keeps in another package
# (docs/coming-from-composer.md): ``from trainkit.loggers import X`` says where X is.
_HINTS = {
    "TensorboardLogger": "Composer's TensorboardLogger is trainkit.loggers.TensorBoardLogger",
    "MLFlowLogger": "Composer's MLFlowLogger is trainkit.loggers.MLflowLogger",
    "MosaicMLLogger": "the MosaicML platform has no trainkit logger; use e.g. "
    "trainkit.loggers.FileLogger, WandBLogger or MLflowLogger",
    "LoggerDestination": "it is trainkit.core.LoggerDestination",
    "Logger": "it is trainkit.core.Logger",
    "SpeedMonitor": "it is trainkit.profiler.SpeedMonitor (trainkit-profiler)",
    "MemoryMonitor": "it is trainkit.profiler.MemoryMonitor (trainkit-profiler)",
    "MemorySnapshot": "it is trainkit.profiler.MemorySnapshot (trainkit-profiler)",
    "OOMObserver": "it is trainkit.profiler.OOMObserver (trainkit-profiler)",
    "RuntimeEstimator": "it is trainkit.profiler.RuntimeEstimator (trainkit-profiler)",
    "SystemMetricsMonitor": "it is trainkit.profiler.SystemMetricsMonitor (trainkit-profiler)",
    "EarlyStopper": "it is trainkit.algorithms.EarlyStopper (trainkit-algorithms)",
    "ThresholdStopper": "it is trainkit.algorithms.ThresholdStopper (trainkit-algorithms)",
    "CheckpointSaver": "Composer's CheckpointSaver is trainkit.checkpoint.Checkpointer "
    "(trainkit-checkpoint), or the Trainer's save_* arguments",
}

__getattr__, __dir__ = lazy_exports(__name__, _MODULES, _HINTS)
