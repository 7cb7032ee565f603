"""What the engine calls: the `Algorithm` and `Callback` base classes.

Everything the engine reads from a component is declared here, with its default; the
engine checks each component when it is registered (`trainkit.core._checks`).
"""

from __future__ import annotations

import abc
import functools
import inspect
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

from trainkit.core._event import Event
from trainkit.core.config import Configurable

if TYPE_CHECKING:
    from collections.abc import Callable

    from trainkit.core._logger import Logger
    from trainkit.core._state import State

__all__ = [
    "ORDERS",
    "Algorithm",
    "Callback",
    "Order",
    "RequiredEvents",
    "Stateful",
    "call_close",
    "call_post_close",
]

Order = Literal["first", "default", "last"]
"""Where an algorithm runs among those that match an event (stable within each)."""
ORDERS: tuple[Order, ...] = ("first", "default", "last")

RequiredEvents = tuple["Event | tuple[Event, ...]", ...]
"""Events a loop must fire for a component to work; a tuple inside means "one of these"."""


@runtime_checkable
class Stateful(Protocol):
    """Anything whose state is saved with the run (DCP's ``Stateful``)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Algorithm(Configurable, abc.ABC):
    """A training method that changes what the loop computes.

    ``match`` is asked at every event (or at its ``match_events``); ``apply`` runs when it
    says yes. Subclass it and declare a config with
    ``class MyMethod(Algorithm, config=MyMethodConfig)``.
    """

    match_events: frozenset[Event] | None = None
    """The events at which ``match`` can say yes: the engine asks it at these only, and an
    event of a batch that no component needs costs nothing (None: asked at every event,
    as Composer asks). Read when the method is registered; set it on the instance when it
    depends on the config."""

    order: ClassVar[Order] = "default"
    """``"first"`` (e.g. it chooses the samples the others see), ``"default"``, or
    ``"last"`` (e.g. it replaces what other surgery produced). AFTER_* events run in reverse."""

    required_events: ClassVar[RequiredEvents] = ()
    """Events the loop must fire for this method to work (a hand-written loop that misses
    one gets a warning instead of silent misbehaviour)."""

    ordering_passes: ClassVar[tuple[Callable[[list[Any], Event], list[Any]], ...]] = ()
    """`OrderingPass` functions the engine registers once, for composition rules."""

    required_on_load: ClassVar[bool] = False
    """The method changes the model's structure: a checkpoint saved with it can only be
    loaded into a run that has it too (checked by trainkit-checkpoint from the manifest)."""

    needs_outputs: ClassVar[bool] = False
    """Set True if it reads ``state.outputs`` after AFTER_LOSS (at BEFORE_BACKWARD,
    AFTER_BACKWARD, AFTER_TRAIN_BATCH, BATCH_END, ...). The loop drops the model's training
    outputs once the loss exists and the train metrics are updated, so they are not kept
    alive through backward and the optimizer step; while a registered component declares
    this, they are kept until the next forward (Composer keeps them unless its
    ``FreeOutputs`` callback is added)."""

    @abc.abstractmethod
    def match(self, event: Event, state: State) -> bool:
        """Whether to run at ``event``."""

    @abc.abstractmethod
    def apply(self, event: Event, state: State, logger: Logger) -> int | None:
        """Do the work; an int return is recorded in the engine's traces."""

    def state_dict(self) -> dict[str, Any]:
        """State that must survive a resume (default: none)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""


class Callback(Configurable):
    """Observes the loop. Override the methods named after the events you need.

    Every method receives ``(state, logger)``. `run_event` dispatches by the event's name,
    so ``Event.BATCH_END`` calls ``batch_end``. A plain object with such methods works too
    (duck-typed); subclass this to have state saved with the run (``state_dict`` /
    ``load_state_dict``), to declare ``required_events`` and a config.
    """

    required_events: ClassVar[RequiredEvents] = ()
    """Events the loop must fire for this callback to work (see `Algorithm`)."""

    needs_outputs: ClassVar[bool] = False
    """Set True if it reads ``state.outputs`` after AFTER_LOSS, which the loop otherwise
    frees then (see `Algorithm.needs_outputs`)."""

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        """Call the method named after ``event``; override to handle every event in one place."""
        getattr(self, event.value)(state, logger)

    def close(self, state: State, logger: Logger) -> None:
        """Finish at the end of the run: flush, wait for background work, release files,
        threads and connections (`Trainer.close`). An error here is raised after every
        other component has been closed."""

    def post_close(self) -> None:
        """Called after every callback and destination has closed (skipped for one whose
        `close` raised): e.g. to remove what others still needed at close."""

    def state_dict(self) -> dict[str, Any]:
        """State saved with the run (default: none)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""

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

    def fit_aborted(self, state: State, logger: Logger) -> None:
        """Called at `Event.FIT_ABORTED`: ``fit`` is raising (any error, KeyboardInterrupt
        included; not a preemption, which ends with ``FIT_END``). Let go of what the fit
        holds (locks, background work) without collectives: the other ranks may not be
        here. The run may go on (another ``fit``) or end (`close` still follows)."""

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

    def eval_standalone_start(self, state: State, logger: Logger) -> None:
        """Called at `Event.EVAL_STANDALONE_START`."""

    def eval_standalone_end(self, state: State, logger: Logger) -> None:
        """Called at `Event.EVAL_STANDALONE_END`."""

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


def call_close(obj: object, state: State | None, logger: Logger | None) -> bool:
    """Call ``obj.close(state, logger)``; a duck-typed ``close()`` without arguments (a file
    handle's, an older callback's) is called without them. Returns whether it had one."""
    close = getattr(obj, "close", None)
    if not callable(close):
        return False
    if _close_takes_arguments(type(obj)):
        close(state, logger)
    else:
        close()
    return True


def call_post_close(obj: object) -> None:
    """Call ``obj.post_close()`` where it has one (duck-typed callbacks may not)."""
    post_close = getattr(obj, "post_close", None)
    if callable(post_close):
        post_close()


@functools.cache
def _close_takes_arguments(cls: type) -> bool:
    try:
        inspect.signature(cls.close).bind(None, None, None)  # (self, state, logger)
    except TypeError:
        return False
    except ValueError:  # no signature (a builtin): assume the plain protocol
        return True
    return True
