"""The points of the training loop where algorithms and callbacks run."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Event"]


class Event(StrEnum):
    """A point in the loop. The value is the name of the matching `Callback` method.

    Forward, loss and backward events fire once per microbatch. The ``*_CHECKPOINT``
    events fire after evaluation at the same point, so a checkpoint holds the eval result.
    An evaluation during ``fit`` is wrapped in ``EVAL_BEFORE_ALL`` / ``EVAL_AFTER_ALL``; one
    asked for by ``Trainer.eval()`` in ``EVAL_STANDALONE_START`` / ``EVAL_STANDALONE_END``
    instead (as Composer). Both run ``EVAL_START`` ... ``EVAL_END`` for each evaluator.
    ``FIT_ABORTED`` fires instead of ``FIT_END`` when ``fit`` raises (a trainkit addition).
    """

    INIT = "init"
    BEFORE_LOAD = "before_load"
    AFTER_LOAD = "after_load"
    FIT_START = "fit_start"
    ITERATION_START = "iteration_start"
    EPOCH_START = "epoch_start"
    BEFORE_DATALOADER = "before_dataloader"
    AFTER_DATALOADER = "after_dataloader"
    BATCH_START = "batch_start"
    BEFORE_TRAIN_BATCH = "before_train_batch"
    BEFORE_FORWARD = "before_forward"
    AFTER_FORWARD = "after_forward"
    BEFORE_LOSS = "before_loss"
    AFTER_LOSS = "after_loss"
    BEFORE_BACKWARD = "before_backward"
    AFTER_BACKWARD = "after_backward"
    AFTER_TRAIN_BATCH = "after_train_batch"
    BATCH_END = "batch_end"
    BATCH_CHECKPOINT = "batch_checkpoint"
    EPOCH_END = "epoch_end"
    EPOCH_CHECKPOINT = "epoch_checkpoint"
    ITERATION_END = "iteration_end"
    ITERATION_CHECKPOINT = "iteration_checkpoint"
    FIT_END = "fit_end"
    FIT_ABORTED = "fit_aborted"
    EVAL_BEFORE_ALL = "eval_before_all"
    EVAL_START = "eval_start"
    EVAL_BATCH_START = "eval_batch_start"
    EVAL_BEFORE_FORWARD = "eval_before_forward"
    EVAL_AFTER_FORWARD = "eval_after_forward"
    EVAL_BATCH_END = "eval_batch_end"
    EVAL_END = "eval_end"
    EVAL_AFTER_ALL = "eval_after_all"
    EVAL_STANDALONE_START = "eval_standalone_start"
    EVAL_STANDALONE_END = "eval_standalone_end"
    PREDICT_START = "predict_start"
    PREDICT_BATCH_START = "predict_batch_start"
    PREDICT_BEFORE_FORWARD = "predict_before_forward"
    PREDICT_AFTER_FORWARD = "predict_after_forward"
    PREDICT_BATCH_END = "predict_batch_end"
    PREDICT_END = "predict_end"

    @property
    def is_after(self) -> bool:
        """True for events that close a pair (``AFTER_*``); algorithms run in reverse."""
        return "after" in self.value

    @property
    def is_eval(self) -> bool:
        return self.value.startswith("eval")

    @property
    def is_predict(self) -> bool:
        return self.value.startswith("predict")
