"""`Engine`: runs algorithms, callbacks and logger destinations at each event."""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from trainkit.core._callback import (
    ORDERS,
    Algorithm,
    Callback,
    call_close,
    call_post_close,
    overrides,
)
from trainkit.core._checks import check_algorithm, check_listener, declared_required_events
from trainkit.core._event import Event
from trainkit.core.messages import warn

if TYPE_CHECKING:
    from trainkit.core._logger import Logger
    from trainkit.core._state import State

__all__ = ["AlgorithmError", "CallbackError", "Engine", "OrderingPass", "Trace"]

OrderingPass = Callable[[list[Algorithm], Event], list[Algorithm]]
"""Reorders (or filters) the algorithms that matched an event; returns the new list."""


class Trace(NamedTuple):
    """One algorithm's run at one event (a named tuple: one is made per algorithm run)."""

    name: str
    event: Event
    order: int
    exit_code: int | None
    seconds: float


class AlgorithmError(RuntimeError):
    """An algorithm raised; the message names it and the event."""


class CallbackError(RuntimeError):
    """A callback or logger destination raised; the message names it and the event."""


_NO_TRACES: list[Trace] = []
# Events a loop fires before its first batch (checked when the first batch starts).
_BEFORE_TRAINING = frozenset({Event.INIT, Event.BEFORE_LOAD, Event.AFTER_LOAD, Event.FIT_START})
_AFTER_EVENTS = frozenset(event for event in Event if event.is_after)  # run in reverse
# Events of each batch that are skipped at once while nothing listens (see run_event);
# BATCH_START, BEFORE_TRAIN_BATCH, EVAL_BATCH_START and PREDICT_BATCH_START are not: they
# read again what is registered.
_IN_BATCH = frozenset(
    {
        Event.BEFORE_DATALOADER,
        Event.AFTER_DATALOADER,
        Event.BEFORE_FORWARD,
        Event.AFTER_FORWARD,
        Event.BEFORE_LOSS,
        Event.AFTER_LOSS,
        Event.BEFORE_BACKWARD,
        Event.AFTER_BACKWARD,
        Event.AFTER_TRAIN_BATCH,
        Event.BATCH_END,
        Event.BATCH_CHECKPOINT,
        Event.EVAL_BEFORE_FORWARD,
        Event.EVAL_AFTER_FORWARD,
        Event.EVAL_BATCH_END,
        Event.PREDICT_BEFORE_FORWARD,
        Event.PREDICT_AFTER_FORWARD,
        Event.PREDICT_BATCH_END,
    }
)


def _name(obj: object) -> str:
    return type(obj).__name__


def _is_oom(err: BaseException) -> bool:
    import torch

    return isinstance(err, torch.OutOfMemoryError)


class Engine:
    """Runs what is registered on ``state`` at each `Event`.

    Order: the algorithms that match, by their ``order`` (``"first"``, ``"default"``,
    ``"last"``; list order within each), then the ordering passes, reversed for ``AFTER_*``
    events so paired transforms unwind like a stack; then callbacks; then logger
    destinations that are callbacks. Every component is checked when it is registered
    (given to the engine, or added to ``state.algorithms`` / ``state.callbacks`` later): a
    non-algorithm, an unknown order, or a callback method that names no event raises. Each event's algorithm runs are returned as
    `Trace` objects, and the last ``history_size`` are kept in `history`.

    Errors keep their cause and gain the culprit's name and the event. An out-of-memory
    error keeps its type (auto-microbatching catches it) and gets a note instead.
    """

    def __init__(self, state: State, logger: Logger, *, history_size: int = 1000):
        self.state = state
        self.logger = logger
        self.passes: list[OrderingPass] = []
        self.history: collections.deque[Trace] = collections.deque(maxlen=history_size)
        self._listeners: dict[Event, list[tuple[object, Callable[..., None]]]] = {}
        self._candidates: dict[Event, list[Algorithm]] = {}  # may match it, ranked
        # What the per-event caches (_listeners, _candidates, _quiet, _outputs_needed) were
        # built for: the registered lists and their lengths. Read again at every event that
        # is not skipped and after every component that ran; the caches are rebuilt when it
        # changes.
        self._registered: tuple[list[Any] | None, ...] = (None, None, None)
        self._registered_lengths: tuple[int, ...] = ()
        self._quiet: set[Event] = set()  # in-batch events fired before that nothing listens to
        self.fired: set[Event] = set()
        self._algorithms_key: tuple[int, int] = (0, -1)
        self._ranked: list[Algorithm] = []
        self._closed = False
        self._outputs_needed = False
        self.log_traces = False
        """Send each event's algorithm runs to the logger (``algorithm_traces/<name>/<event>``:
        the algorithm's int return value, or 1) -- the Trainer's ``log_traces``."""
        self._check_registered()  # checks the callbacks now

    def register_pass(self, ordering_pass: OrderingPass, index: int = -1) -> None:
        """Add an ordering pass; ``index=-1`` appends, ``0`` runs it first."""
        if index == -1:
            self.passes.append(ordering_pass)
        else:
            self.passes.insert(index, ordering_pass)

    def run_event(self, event: Event | str) -> list[Trace]:
        """Run the algorithms that match ``event``, then the callbacks and destinations that
        listen to it; returns the algorithms' `Trace` objects.

        This runs 13 times per batch, mostly for events nobody listens to. Such an event
        (one of a batch's other than BATCH_START and BEFORE_TRAIN_BATCH; of an evaluation or
        prediction batch's other than EVAL_BATCH_START and PREDICT_BATCH_START) returns at
        once once it has fired with no listener. Every other event reads again what is
        registered, and so does the end of any event that ran a component: a component that
        another one adds hears the very next event; one added by other code hears the
        batch's events from the next BATCH_START (or BEFORE_TRAIN_BATCH, EVAL_BATCH_START,
        PREDICT_BATCH_START) on.
        """
        if event in self._quiet:  # a str compares equal to its Event
            return _NO_TRACES
        return self._dispatch(event if event.__class__ is Event else Event(event))

    def _dispatch(self, event: Event) -> list[Trace]:
        if event not in self.fired:
            self.fired.add(event)
            if event is Event.BATCH_START:  # the first batch: were the set-up events fired?
                self.check_required_events(_BEFORE_TRAINING)
        state = self.state
        if not state.algorithms and not state.callbacks and not self.logger.destinations:
            self._registered = (None, None, None)  # nothing to listen: read afresh next
            self._outputs_needed = False
            if event in _IN_BATCH:
                self._quiet.add(event)
            return _NO_TRACES
        self._check_registered()
        candidates = self._candidates.get(event)
        if candidates is None:
            candidates = self._candidates_for(event)
        traces = self._run_algorithms(event, candidates) if candidates else _NO_TRACES
        if traces:
            self._check_registered()  # an algorithm may have added or removed a component
        listeners = self._listeners.get(event)
        if listeners is None:
            listeners = self._listeners_for(event)
        if not listeners:
            if not candidates and event in _IN_BATCH:
                self._quiet.add(event)
            return traces
        for listener, handler in listeners:
            try:
                handler(state, self.logger)
            except Exception as err:
                if event != Event.INIT and self._is_destination_only(listener) and not _is_oom(err):
                    # Like its log_* calls, a logger failing mid-run (disk full, network) must
                    # not stop training; at INIT its set-up errors still stop the run early.
                    self.logger.report_failure(listener, event.value, err)
                    continue
                _raise_with_context(err, CallbackError, f"callback {_name(listener)}", event)
        self._check_registered()  # a handler may have added or removed a component
        return traces

    def _check_registered(self) -> None:
        # Empties the per-event caches when the registered lists changed (replaced, or
        # grown or shrunk in place), once what is new passes its checks (a component that
        # fails them raises at every event until it is fixed or removed). Runs several
        # times per batch, so it compares identities and lengths, building no ids.
        state, destinations = self.state, self.logger.destinations
        algorithms, callbacks = state.algorithms, state.callbacks
        seen = self._registered
        lengths = (len(algorithms), len(callbacks), len(destinations))
        if (
            algorithms is seen[0]
            and callbacks is seen[1]
            and destinations is seen[2]
            and lengths == self._registered_lengths
        ):
            return
        self._sync_algorithms()
        for callback in callbacks:
            check_listener(callback)
        self._registered = (algorithms, callbacks, destinations)
        self._registered_lengths = lengths
        self._listeners, self._candidates = {}, {}
        self._quiet = set()
        self._outputs_needed = any(
            getattr(component, "needs_outputs", False) is True
            for component in [*algorithms, *callbacks, *destinations]
        )

    def run_cleanup_event(self, event: Event | str) -> list[Exception]:
        """Run ``event`` for every algorithm, callback and destination even when some raise
        (for ``FIT_ABORTED``: each gets its chance to clean up); returns the errors, each
        naming its culprit and the event."""
        event = Event(event)
        self.fired.add(event)
        self._check_registered()
        errors: list[Exception] = []
        try:
            candidates = self._candidates_for(event)
            if candidates:
                self._run_algorithms(event, candidates)
        except Exception as err:
            errors.append(err)
        for listener, handler in self._listeners_for(event):
            try:
                handler(self.state, self.logger)
            except Exception as err:
                who = f"callback {_name(listener)}"
                errors.append(CallbackError(f"{who} failed at event {event.name}: {err!r}"))
        return errors

    def _run_algorithms(self, event: Event, candidates: list[Algorithm]) -> list[Trace]:
        state, logger = self.state, self.logger
        matched = [a for a in candidates if a.match(event, state)]
        if not matched:
            return _NO_TRACES  # the passes order (or filter) what matched: nothing to do
        for ordering_pass in self.passes:
            matched = ordering_pass(matched, event)
        if event in _AFTER_EVENTS:
            matched = matched[::-1]  # a copy: a pass may have returned a list it keeps
        traces = []
        for order, algorithm in enumerate(matched):
            start = time.perf_counter()
            try:
                exit_code = algorithm.apply(event, state, logger)
            except Exception as err:
                _raise_with_context(err, AlgorithmError, f"algorithm {_name(algorithm)}", event)
            trace = Trace(_name(algorithm), event, order, exit_code, time.perf_counter() - start)
            traces.append(trace)
            self.history.append(trace)
        if self.log_traces and traces:
            logger.log_traces(
                {
                    f"algorithm_traces/{t.name}/{t.event.value}": 1
                    if t.exit_code is None
                    else t.exit_code
                    for t in traces
                }
            )
        return traces

    def outputs_needed(self) -> bool:
        """Whether a registered algorithm, callback or destination declares
        ``needs_outputs``: then the loop keeps ``state.outputs`` through backward and the
        optimizer step, else it drops them after AFTER_LOSS. Read with the other per-event
        caches (see `run_event`), not per call."""
        return self._outputs_needed

    def _is_destination_only(self, listener: object) -> bool:
        return any(d is listener for d in self.logger.destinations) and not any(
            c is listener for c in self.state.callbacks
        )

    def _candidates_for(self, event: Event) -> list[Algorithm]:
        # The algorithms whose match() is asked at ``event``: those that declare it among
        # their match_events, or declare none (asked at every event); ranked by order.
        candidates = self._candidates.get(event)
        if candidates is None:
            candidates = [a for a in self._ranked if _may_match(a, event)]
            self._candidates[event] = candidates
        return candidates

    def _sync_algorithms(self) -> None:
        # Runs when the algorithm list changes, not per event: check new algorithms, rank
        # them by order, and register the ordering passes they carry (once each).
        algorithms = self.state.algorithms
        key = (id(algorithms), len(algorithms))
        if key == self._algorithms_key:
            return
        for algorithm in algorithms:
            check_algorithm(algorithm)
            for ordering_pass in algorithm.ordering_passes:
                if ordering_pass not in self.passes:
                    self.register_pass(ordering_pass)
        self._ranked = sorted(algorithms, key=lambda a: ORDERS.index(a.order))
        self._algorithms_key = key

    def _listeners_for(self, event: Event) -> Sequence[tuple[object, Callable[..., None]]]:
        # Callbacks and destinations that only inherit no-ops are skipped; built once per
        # event for what is registered (_check_registered empties it when that changes).
        listeners = self._listeners.get(event)
        if listeners is None:
            unique = {id(c): c for c in [*self.state.callbacks, *self.logger.destinations]}
            listeners = [(c, _handler(c, event)) for c in unique.values() if overrides(c, event)]
            self._listeners[event] = listeners
        return listeners

    def check_required_events(self, among: frozenset[Event] | None = None) -> list[str]:
        """Warn about components whose ``required_events`` were never fired.

        A component (algorithm, callback, destination) may declare ``required_events``:
        events, or tuples of events of which at least one must fire. ``among`` limits the
        check to those events (the Engine checks the set-up events at the first batch, and
        all of them at `close`). Returns the warnings given.
        """
        problems = []
        for component in [*self.state.algorithms, *self.state.callbacks, *self.logger.destinations]:
            for need in declared_required_events(component):
                options = need if isinstance(need, tuple) else (need,)
                if among is not None and not any(e in among for e in options):
                    continue
                if not any(e in self.fired for e in options):
                    names = " or ".join(f"Event.{Event(e).name}" for e in options)
                    problems.append(
                        f"{_name(component)} needs {names}, which this loop never fired, so it "
                        "cannot do its job; fire it where the Trainer does (trainkit-core README, "
                        "'The event contract')"
                    )
        for problem in problems:
            warn(problem, RuntimeWarning)
        return problems

    def close(self) -> None:
        """End the run's components, once: check required events (if anything trained), then
        ``close(state, logger)`` every callback and destination, then ``post_close()`` those
        that closed cleanly (as Composer). Every component is closed even when one fails;
        then the first callback error is raised (a destination's is reported as a warning,
        like its other failures)."""
        if self._closed:
            return
        self._closed = True
        # An eval- or predict-only use needs no training events; a fit that raised fired
        # FIT_ABORTED instead of FIT_END: the loop is not at fault, so no warning then either.
        if Event.BATCH_START in self.fired and Event.FIT_ABORTED not in self.fired:
            self.check_required_events()
        state, logger = self.state, self.logger
        unique = {id(c): c for c in [*state.callbacks, *logger.destinations]}
        errors: list[tuple[object, str, Exception]] = []
        closed = []
        for component in unique.values():
            try:
                if call_close(component, state, logger):
                    closed.append(component)
            except Exception as err:
                errors.append((component, "close", err))
        for component in closed:
            try:
                call_post_close(component)
            except Exception as err:
                errors.append((component, "post_close", err))
        raised = []
        for component, method, err in errors:
            if self._is_destination_only(component):
                logger.report_failure(component, method, err)
            else:
                raised.append((component, method, err))
        if raised:
            (component, method, err), *others = raised
            wrapped = CallbackError(f"callback {_name(component)}.{method}() failed: {err!r}")
            for other, other_method, other_err in others:
                wrapped.add_note(f"also failed: {_name(other)}.{other_method}(): {other_err!r}")
            raise wrapped from err


def _may_match(algorithm: Algorithm, event: Event) -> bool:
    events = algorithm.match_events
    return events is None or event in events


def _handler(listener: object, event: Event) -> Callable[..., None]:
    run_event = getattr(listener, "run_event", None)
    if run_event is None or getattr(run_event, "__func__", None) is Callback.run_event:
        # The method named after the event: what Callback.run_event would look up each time.
        return getattr(listener, event.value)
    return functools.partial(run_event, event)


def _raise_with_context(err: Exception, wrapper: type[RuntimeError], who: str, event: Event):
    message = f"{who} failed at event {event.name}: {type(err).__name__}: {err}"
    if _is_oom(err):
        err.add_note(message)
        raise err
    raise wrapper(message) from err
