"""What the engine calls: the `Algorithm` protocol and the `Callback` base class."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from trainkit.core._event import Event

if TYPE_CHECKING:
    from trainkit.core._logger import Logger
    from trainkit.core._state import State

__all__ = ["Algorithm", "Callback"]


@runtime_checkable
class Algorithm(Protocol):
    """A training method that changes what the loop computes.

    ``match`` is asked at every event; ``apply`` runs when it says yes. Optional members
    (looked up with ``getattr``): ``state_dict()`` / ``load_state_dict(sd)`` for state that
    must survive a resume, ``required_on_load`` (class attribute, default False) for
    methods that change the model and must be re-applied before loading a checkpoint, and
    ``ordering_passes`` (class attribute): `OrderingPass` functions the engine registers
    once, for composition rules such as "run me first"; ``required_events``: events the
    loop must fire for the algorithm to work (a tuple inside means "one of these"), so a
    hand-written loop that misses one gets a warning instead of silent misbehaviour.
    """

    def match(self, event: Event, state: State) -> bool: ...

    def apply(self, event: Event, state: State, logger: Logger) -> int | None: ...


class Callback:
    """Observes the loop. Override the methods named after the events you need.

    Every method receives ``(state, logger)``. `run_event` dispatches by the event's name,
    so ``Event.BATCH_END`` calls ``batch_end``. Override ``state_dict`` / ``load_state_dict``
    to have the callback's state saved with the run, and set ``required_events`` (see
    `Algorithm`) when the callback cannot work without some events.
    """

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        getattr(self, event.value)(state, logger)

    def close(self) -> None:
        """Release resources at the end of the run (files, threads, connections)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    # One no-op per event, in loop order.

    def init(self, state: State, logger: Logger) -> None:
        """Called at `Event.INIT`."""

    def before_load(self, state: State, logger: Logger) -> None:
        """Called at `Event.BEFORE_LOAD`."""

    def after_load(self, state: State, logger: Logger) -> None:
        """Called at `Event.AFTER_LOAD`."""

    def fit_start(self, state: State, logger: Logger) -> None:
        """Called at `Event.FIT_START`."""

    def iteration_start(self, state: State, logger: Logger) -> None:
        """Called at `Event.ITERATION_START`."""

    def epoch_start(self, state: State, logger: Logger) -> None:
        """Called at `Event.EPOCH_START`."""

    def before_dataloader(self, state: State, logger: Logger) -> None:
        """Called at `Event.BEFORE_DATALOADER`."""

    def after_dataloader(self, state: State, logger: Logger) -> None:
        """Called at `Event.AFTER_DATALOADER`."""

    def batch_start(self, state: State, logger: Logger) -> None:
        """Called at `Event.BATCH_START`."""

    def before_train_batch(self, state: State, logger: Logger) -> None:
        """Called at `Event.BEFORE_TRAIN_BATCH`."""

    def before_forward(self, state: State, logger: Logger) -> None:
        """Called at `Event.BEFORE_FORWARD`."""

    def after_forward(self, state: State, logger: Logger) -> None:
        """Called at `Event.AFTER_FORWARD`."""

    def before_loss(self, state: State, logger: Logger) -> None:
        """Called at `Event.BEFORE_LOSS`."""

    def after_loss(self, state: State, logger: Logger) -> None:
        """Called at `Event.AFTER_LOSS`."""

    def before_backward(self, state: State, logger: Logger) -> None:
        """Called at `Event.BEFORE_BACKWARD`."""

    def after_backward(self, state: State, logger: Logger) -> None:
        """Called at `Event.AFTER_BACKWARD`."""

    def after_train_batch(self, state: State, logger: Logger) -> None:
        """Called at `Event.AFTER_TRAIN_BATCH`."""

    def batch_end(self, state: State, logger: Logger) -> None:
        """Called at `Event.BATCH_END`."""

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        """Called at `Event.BATCH_CHECKPOINT`."""

    def epoch_end(self, state: State, logger: Logger) -> None:
        """Called at `Event.EPOCH_END`."""

    def epoch_checkpoint(self, state: State, logger: Logger) -> None:
        """Called at `Event.EPOCH_CHECKPOINT`."""

    def iteration_end(self, state: State, logger: Logger) -> None:
        """Called at `Event.ITERATION_END`."""

    def iteration_checkpoint(self, state: State, logger: Logger) -> None:
        """Called at `Event.ITERATION_CHECKPOINT`."""

    def fit_end(self, state: State, logger: Logger) -> None:
        """Called at `Event.FIT_END`."""

    def eval_before_all(self, state: State, logger: Logger) -> None:
        """Called at `Event.EVAL_BEFORE_ALL`."""

    def eval_start(self, state: State, logger: Logger) -> None:
        """Called at `Event.EVAL_START`."""

    def eval_batch_start(self, state: State, logger: Logger) -> None:
        """Called at `Event.EVAL_BATCH_START`."""

    def eval_before_forward(self, state: State, logger: Logger) -> None:
        """Called at `Event.EVAL_BEFORE_FORWARD`."""

    def eval_after_forward(self, state: State, logger: Logger) -> None:
        """Called at `Event.EVAL_AFTER_FORWARD`."""

    def eval_batch_end(self, state: State, logger: Logger) -> None:
        """Called at `Event.EVAL_BATCH_END`."""

    def eval_end(self, state: State, logger: Logger) -> None:
        """Called at `Event.EVAL_END`."""

    def eval_after_all(self, state: State, logger: Logger) -> None:
        """Called at `Event.EVAL_AFTER_ALL`."""

    def predict_start(self, state: State, logger: Logger) -> None:
        """Called at `Event.PREDICT_START`."""

    def predict_batch_start(self, state: State, logger: Logger) -> None:
        """Called at `Event.PREDICT_BATCH_START`."""

    def predict_before_forward(self, state: State, logger: Logger) -> None:
        """Called at `Event.PREDICT_BEFORE_FORWARD`."""

    def predict_after_forward(self, state: State, logger: Logger) -> None:
        """Called at `Event.PREDICT_AFTER_FORWARD`."""

    def predict_batch_end(self, state: State, logger: Logger) -> None:
        """Called at `Event.PREDICT_BATCH_END`."""

    def predict_end(self, state: State, logger: Logger) -> None:
        """Called at `Event.PREDICT_END`."""


def overrides(obj: object, event: Event) -> bool:
    """Whether ``obj`` does something at ``event``.

    True for an object with its own ``run_event``, or with a method named after the event
    that is not `Callback`'s no-op: duck-typed callbacks need no base class.
    """
    cls = type(obj)
    run_event = getattr(cls, "run_event", None)
    if run_event is not None and run_event is not Callback.run_event:
        return True
    method = getattr(cls, event.value, None)
    return callable(method) and method is not getattr(Callback, event.value, None)
