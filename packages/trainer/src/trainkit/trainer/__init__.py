"""trainkit.trainer: the ready-made Trainer and its batteries.

`Trainer` runs the loop of `trainkit.core` (events, algorithms, callbacks, strategies) as
its `TrainerConfig` says. Beside it: `Classifier` and `HuggingFaceModel`, and the public
submodules `trainkit.trainer.loop` (the run's phases, for a loop of your own), `.metrics`,
`.optim`, `.schedulers` (the learning-rate schedules) and `.streaming`.
"""

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
