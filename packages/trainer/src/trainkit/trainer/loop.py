"""The phases of a run and the pieces of a training step, for writing your own loop.

The `Trainer` is written on these functions; a hand-written loop calls the same ones (see
the trainer README, "Your own step on the Trainer's phases"), so algorithms, callbacks,
loggers and checkpoints keep working.
"""

from trainkit.trainer._eval import eval_forward, evaluate
from trainkit.trainer._loop import (
    BatchClock,
    epoch_batches,
    finish_batch,
    finish_epoch,
    prepare_run,
    start_batch,
)
from trainkit.trainer._retry import train_batch
from trainkit.trainer._step import (
    microbatch_weights,
    optimizer_step,
    run_microbatches,
    scheduler_step,
)

__all__ = [
    "BatchClock",
    "epoch_batches",
    "eval_forward",
    "evaluate",
    "finish_batch",
    "finish_epoch",
    "microbatch_weights",
    "optimizer_step",
    "prepare_run",
    "run_microbatches",
    "scheduler_step",
    "start_batch",
    "train_batch",
]
