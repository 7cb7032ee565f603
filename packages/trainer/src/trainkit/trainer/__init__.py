"""trainkit.trainer: the ready-made Trainer and its batteries.

`Trainer` runs the loop of `trainkit.core` (events, algorithms, callbacks, strategies) as
its `TrainerConfig` says. Beside it: `Classifier` and `HuggingFaceModel`, and the public
submodules `trainkit.trainer.loop` (the run's phases, for a loop of your own), `.goodput`
(reading a run's goodput ledger), `.metrics`, `.optim`, `.schedulers` (the learning-rate
schedules) and `.streaming`.
"""

from trainkit.core.plugins import name_hints
from trainkit.trainer._classifier import Classifier
from trainkit.trainer._hf import HuggingFaceModel
from trainkit.trainer._nonfinite import NonFiniteLossError
from trainkit.trainer._trainer import Trainer
from trainkit.trainer._trainer_config import TrainerConfig

__all__ = [
    "Classifier",
    "HuggingFaceModel",
    "NonFiniteLossError",
    "Trainer",
    "TrainerConfig",
]

# ``from composer import Trainer, Time, Event, ...`` ported to this package: the contract's
# names are in trainkit.core (docs/coming-from-composer.md).
_CORE_NAMES = (
    "Algorithm",
    "Callback",
    "DataSpec",
    "Engine",
    "Evaluator",
    "Event",
    "Logger",
    "LoggerDestination",
    "State",
    "Time",
    "TimeUnit",
    "Timestamp",
    "TrainModel",
)
__getattr__ = name_hints(
    __name__,
    {
        **{
            name: f"it is in trainkit-core: from trainkit.core import {name}"
            for name in _CORE_NAMES
        },
        "ComposerModel": "Composer's ComposerModel is trainkit.core.TrainModel",
        "ComposerClassifier": "Composer's ComposerClassifier is trainkit.trainer.Classifier",
    },
)
