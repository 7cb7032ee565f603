"""trainkit.loggers: logger destinations and training monitors, found by entry point name.

Destinations (group ``trainkit.loggers``): ``progress``, ``console``, ``file``,
``in_memory``, ``wandb``, ``tensorboard``, ``mlflow``. Monitors (group
``trainkit.callbacks``): ``lr_monitor``, ``optimizer_monitor``, ``nan_monitor``. Command
(group ``trainkit.commands``): ``plot``. Heavy clients are imported only when their
destination is created.
"""

from trainkit.loggers._console import ConsoleLogger
from trainkit.loggers._file import FileLogger, read_jsonl
from trainkit.loggers._in_memory import InMemoryLogger
from trainkit.loggers._lr_monitor import LRMonitor
from trainkit.loggers._mlflow import MLflowLogger
from trainkit.loggers._nan_monitor import NaNMonitor
from trainkit.loggers._optimizer_monitor import OptimizerMonitor, l2_norms
from trainkit.loggers._progress import ProgressBar
from trainkit.loggers._tensorboard import TensorBoardLogger
from trainkit.loggers._wandb import WandBLogger

__all__ = [
    "ConsoleLogger",
    "FileLogger",
    "InMemoryLogger",
    "LRMonitor",
    "MLflowLogger",
    "NaNMonitor",
    "OptimizerMonitor",
    "ProgressBar",
    "TensorBoardLogger",
    "WandBLogger",
    "l2_norms",
    "read_jsonl",
]
