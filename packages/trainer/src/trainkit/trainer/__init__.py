"""trainkit.trainer: the ready-made Trainer and its batteries.

`Trainer` runs the loop of `trainkit.core` (events, algorithms, callbacks, strategies) as
its `TrainerConfig` says. Beside it: `Classifier` and `HuggingFaceModel`, learning-rate
schedules, and the public submodules `trainkit.trainer.loop` (the run's phases, for a loop
of your own), `.metrics`, `.optim` and `.schedulers`.
"""

from trainkit.trainer._classifier import Classifier
from trainkit.trainer._hf import HuggingFaceModel
from trainkit.trainer._nonfinite import NonFiniteLossError
from trainkit.trainer._trainer import Trainer
from trainkit.trainer._trainer_config import TrainerConfig
from trainkit.trainer.schedulers import (
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
    "Classifier",
    "ConstantScheduler",
    "ConstantWithWarmupScheduler",
    "CosineAnnealingScheduler",
    "CosineAnnealingWarmRestartsScheduler",
    "CosineAnnealingWithWarmupScheduler",
    "ExponentialScheduler",
    "HuggingFaceModel",
    "LinearScheduler",
    "LinearWithWarmupScheduler",
    "MultiStepScheduler",
    "MultiStepWithWarmupScheduler",
    "NonFiniteLossError",
    "PolynomialScheduler",
    "PolynomialWithWarmupScheduler",
    "Scheduler",
    "StepScheduler",
    "Trainer",
    "TrainerConfig",
]
