"""trainkit.core: the contracts and a short, readable training loop."""

from trainkit.core._callback import Algorithm, Callback
from trainkit.core._data import DataSpec, ResumableBatchSampler, default_split_batch, to_device
from trainkit.core._engine import AlgorithmError, CallbackError, Engine, OrderingPass, Trace
from trainkit.core._event import Event
from trainkit.core._hf import HuggingFaceModel
from trainkit.core._interval import IntervalTrigger, interval_trigger
from trainkit.core._logger import Logger, LoggerDestination
from trainkit.core._loop import (
    BatchClock,
    epoch_batches,
    finish_batch,
    finish_epoch,
    prepare_run,
    start_batch,
)
from trainkit.core._metrics import Accuracy, CrossEntropy, Mean, Metric, Perplexity
from trainkit.core._model import Classifier, TrainModel
from trainkit.core._parallel import ParallelStrategy, SingleProcess
from trainkit.core._precision import Device, Precision, autocast, resolve_device
from trainkit.core._progress import ProgressLines
from trainkit.core._rng import get_rng_state, seed_everything, set_rng_state
from trainkit.core._state import Evaluator, State
from trainkit.core._step import (
    eval_forward,
    evaluate,
    optimizer_step,
    rebind_optimizers,
    run_microbatches,
    scheduler_step,
    train_batch,
)
from trainkit.core._time import Time, Timestamp, TimeUnit, ensure_time
from trainkit.core._trainer import Trainer
from trainkit.core.schedulers import (
    ConstantScheduler,
    CosineAnnealingScheduler,
    CosineAnnealingWithWarmupScheduler,
    ExponentialScheduler,
    LinearScheduler,
    LinearWithWarmupScheduler,
    MultiStepScheduler,
    PolynomialScheduler,
    Scheduler,
    StepScheduler,
)

__all__ = [
    "Accuracy",
    "Algorithm",
    "AlgorithmError",
    "BatchClock",
    "Callback",
    "CallbackError",
    "Classifier",
    "ConstantScheduler",
    "CosineAnnealingScheduler",
    "CosineAnnealingWithWarmupScheduler",
    "CrossEntropy",
    "DataSpec",
    "Device",
    "Engine",
    "Evaluator",
    "Event",
    "ExponentialScheduler",
    "HuggingFaceModel",
    "IntervalTrigger",
    "LinearScheduler",
    "LinearWithWarmupScheduler",
    "Logger",
    "LoggerDestination",
    "Mean",
    "Metric",
    "MultiStepScheduler",
    "OrderingPass",
    "ParallelStrategy",
    "Perplexity",
    "PolynomialScheduler",
    "Precision",
    "ProgressLines",
    "ResumableBatchSampler",
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
    "autocast",
    "default_split_batch",
    "ensure_time",
    "epoch_batches",
    "eval_forward",
    "evaluate",
    "finish_batch",
    "finish_epoch",
    "get_rng_state",
    "interval_trigger",
    "optimizer_step",
    "prepare_run",
    "rebind_optimizers",
    "resolve_device",
    "run_microbatches",
    "scheduler_step",
    "seed_everything",
    "set_rng_state",
    "start_batch",
    "to_device",
    "train_batch",
]
