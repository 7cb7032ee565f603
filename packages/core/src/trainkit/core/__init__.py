"""trainkit.core: the contracts and a short, readable training loop.

The top level holds the contract: what users and sibling packages build on. The rest is
in public submodules: `trainkit.core.loop` (the run's phases, for your own loop),
`.metrics`, `.data`, `.config`, `.precision`, `.interval`, `.rng`, `.schedulers`, `.optim`,
`.dist`, `.plugins`.
"""

from trainkit.core._callback import ORDERS, Algorithm, Callback, Order
from trainkit.core._data import DataSpec
from trainkit.core._engine import AlgorithmError, CallbackError, Engine, OrderingPass, Trace
from trainkit.core._event import Event
from trainkit.core._hf import HuggingFaceModel
from trainkit.core._logger import Logger, LoggerDestination
from trainkit.core._model import Classifier, TrainModel
from trainkit.core._nonfinite import NonFiniteLossError
from trainkit.core._parallel import ParallelStrategy, SingleProcess
from trainkit.core._precision import Device, MixedPrecision, Precision
from trainkit.core._preemption import PREEMPTED_EXIT_CODE, PreemptionRequest, TrainingPreempted
from trainkit.core._state import Evaluator, State
from trainkit.core._time import Time, Timestamp, TimeUnit, ensure_time
from trainkit.core._trainer import Trainer
from trainkit.core._trainer_config import TrainerConfig
from trainkit.core.config import Configurable
from trainkit.core.schedulers import (
    ConstantScheduler,
    ConstantWithWarmupScheduler,
    CosineAnnealingScheduler,
    CosineAnnealingWarmRestartsScheduler,
    CosineAnnealingWithWarmupScheduler,
    ExponentialScheduler,
    LinearScheduler,
    LinearWithWarmupScheduler,
    MultiStepScheduler,
    MultiStepWithWarmupScheduler,
    PolynomialScheduler,
    PolynomialWithWarmupScheduler,
    Scheduler,
    StepScheduler,
)

__all__ = [
    "ORDERS",
    "PREEMPTED_EXIT_CODE",
    "Algorithm",
    "AlgorithmError",
    "Callback",
    "CallbackError",
    "Classifier",
    "Configurable",
    "ConstantScheduler",
    "ConstantWithWarmupScheduler",
    "CosineAnnealingScheduler",
    "CosineAnnealingWarmRestartsScheduler",
    "CosineAnnealingWithWarmupScheduler",
    "DataSpec",
    "Device",
    "Engine",
    "Evaluator",
    "Event",
    "ExponentialScheduler",
    "HuggingFaceModel",
    "LinearScheduler",
    "LinearWithWarmupScheduler",
    "Logger",
    "LoggerDestination",
    "MixedPrecision",
    "MultiStepScheduler",
    "MultiStepWithWarmupScheduler",
    "NonFiniteLossError",
    "Order",
    "OrderingPass",
    "ParallelStrategy",
    "PolynomialScheduler",
    "PolynomialWithWarmupScheduler",
    "Precision",
    "PreemptionRequest",
    "Scheduler",
    "SingleProcess",
    "State",
    "StepScheduler",
    "Time",
    "TimeUnit",
    "Timestamp",
    "Trace",
    "TrainModel",
    "Trainer",
    "TrainerConfig",
    "TrainingPreempted",
    "ensure_time",
]
