"""trainkit.core: the contract between the training loop and its components.

Events and the engine that runs components at them, the component protocols (Algorithm,
Callback, LoggerDestination, ParallelStrategy, Precision, TrainModel), the run's State,
time, data and its exact-resume positions. The ready-made loop is trainkit-trainer
(`trainkit.trainer`). Public submodules: `trainkit.core.config`, `.data`, `.dist`,
`.interval`, `.messages`, `.meta`, `.plugins`, `.precision`, `.progress`, `.rng`.
"""

from trainkit.core._callback import ORDERS, Algorithm, Callback, Order
from trainkit.core._data import DataSpec
from trainkit.core._destination import LoggerDestination
from trainkit.core._engine import AlgorithmError, CallbackError, Engine, OrderingPass, Trace
from trainkit.core._event import Event
from trainkit.core._logger import Logger
from trainkit.core._model import PretrainedWrapper, TrainModel, repeated_blocks
from trainkit.core._parallel import ParallelStrategy, SingleProcess
from trainkit.core._precision import Device, MixedPrecision, Precision
from trainkit.core._preemption import PREEMPTED_EXIT_CODE, PreemptionRequest, TrainingPreempted
from trainkit.core._rebind import rebind_optimizers
from trainkit.core._state import Evaluator, State
from trainkit.core._time import Time, Timestamp, TimeUnit, ensure_time
from trainkit.core.plugins import name_hints

__all__ = [
    "ORDERS",
    "PREEMPTED_EXIT_CODE",
    "Algorithm",
    "AlgorithmError",
    "Callback",
    "CallbackError",
    "DataSpec",
    "Device",
    "Engine",
    "Evaluator",
    "Event",
    "Logger",
    "LoggerDestination",
    "MixedPrecision",
    "Order",
    "OrderingPass",
    "ParallelStrategy",
    "Precision",
    "PreemptionRequest",
    "PretrainedWrapper",
    "SingleProcess",
    "State",
    "Time",
    "TimeUnit",
    "Timestamp",
    "Trace",
    "TrainModel",
    "TrainingPreempted",
    "ensure_time",
    "rebind_optimizers",
    "repeated_blocks",
]

# Names a Composer port (``from composer import Trainer``) reaches for here, and where they
# are (docs/coming-from-composer.md).
_TRAINER = {name: f"it is in trainkit-trainer: from trainkit.trainer import {name}"
            for name in ("Trainer", "TrainerConfig", "Classifier", "HuggingFaceModel")}  # fmt: skip
__getattr__ = name_hints(__name__, {
    **_TRAINER,
    "ComposerModel": "Composer's ComposerModel is trainkit.core.TrainModel",
    "ComposerClassifier": "Composer's ComposerClassifier is trainkit.trainer.Classifier",
})  # fmt: skip
