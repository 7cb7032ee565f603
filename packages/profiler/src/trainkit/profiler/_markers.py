"""``record_function`` markers around the loop's phases, algorithms and callbacks.

Core's `Engine` has no profiling hook, so while a profiling cycle runs the `Profiler`
wraps, on the instances only, each algorithm's ``apply`` and each callback's event
methods in a function that opens a ``record_function`` range, and puts a `PhaseMarkers`
callback first in ``state.callbacks`` to mark the loop's phases. Both are removed when
the cycle ends, so batches outside the cycles pay nothing for them.

This relies on how the Engine calls components: ``algorithm.apply(...)`` is looked up on
the instance at every event, and a `Callback`'s handler is its ``run_event``, which looks
the event method up on the instance (``getattr(self, event.value)``). A duck-typed
callback's bound method is cached by the Engine until the callback list changes, which
inserting and removing `PhaseMarkers` does, after installing and removing the wrappers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from torch.autograd.profiler import record_function

from trainkit.core import Callback, Event

__all__ = ["PHASES", "Markers", "PhaseMarkers"]

# Ranges opened at the first event and closed at the second, named after the phase.
PHASES: dict[Event, tuple[str, Event]] = {
    Event.BEFORE_DATALOADER: ("trainkit/dataloader", Event.AFTER_DATALOADER),
    Event.BEFORE_FORWARD: ("trainkit/forward", Event.AFTER_FORWARD),
    Event.BEFORE_LOSS: ("trainkit/loss", Event.AFTER_LOSS),
    Event.BEFORE_BACKWARD: ("trainkit/backward", Event.AFTER_BACKWARD),
    Event.AFTER_TRAIN_BATCH: ("trainkit/optimizer_step", Event.BATCH_END),
    Event.EVAL_BEFORE_ALL: ("trainkit/eval", Event.EVAL_AFTER_ALL),
    Event.EVAL_STANDALONE_START: ("trainkit/eval", Event.EVAL_STANDALONE_END),
}
_CLOSED_BY = {closing: opening for opening, (_, closing) in PHASES.items()}


def _overrides(obj: object, event: Event) -> bool:
    # What the Engine calls at ``event``: a method other than Callback's no-op. Duck-typed
    # callbacks (no base class) are still accepted by the Engine, so they are looked up too.
    method = getattr(type(obj), event.value, None)
    return callable(method) and method is not getattr(Callback, event.value, None)


def _own_run_event(obj: object) -> bool:
    if isinstance(obj, Callback):
        return type(obj).run_event is not Callback.run_event
    return callable(getattr(type(obj), "run_event", None))


def _by_event(prefix: str) -> Callable[..., str]:
    def name(event: Event | str, *_: Any) -> str:
        return f"{prefix}/{Event(event).value}"

    return name


class Markers:
    """Installs the wrappers; ``recording()`` says whether a range should be opened now."""

    def __init__(self, recording: Callable[[], bool]):
        self.recording = recording
        self._installed: list[tuple[object, str]] = []
        self._open: dict[Event, Any] = {}

    def _wrap(self, obj: object, attribute: str, name: Callable[..., str]) -> None:
        original = getattr(obj, attribute)
        recording = self.recording

        @functools.wraps(original)
        def marked(*args: Any, **kwargs: Any) -> Any:
            if not recording():
                return original(*args, **kwargs)
            with record_function(name(*args)):
                return original(*args, **kwargs)

        try:
            setattr(obj, attribute, marked)
        except (AttributeError, TypeError):  # __slots__ or a frozen object: left unmarked
            return
        self._installed.append((obj, attribute))

    def install(self, algorithms: Iterable[object], callbacks: Iterable[object]) -> None:
        """Mark ``algorithm.apply`` and every event method the callbacks define."""
        for algorithm in algorithms:
            self._wrap(
                algorithm, "apply", _by_event(f"trainkit/algorithm/{type(algorithm).__name__}")
            )
        for callback in callbacks:
            label = type(callback).__name__
            if _own_run_event(callback):
                self._wrap(callback, "run_event", _by_event(f"trainkit/callback/{label}"))
                continue
            for event in Event:
                if _overrides(callback, event):
                    name = f"trainkit/callback/{label}/{event.value}"
                    self._wrap(callback, event.value, lambda *_, name=name: name)

    def remove(self) -> None:
        """Put the original methods back."""
        for obj, attribute in self._installed:
            vars(obj).pop(attribute, None)
        self._installed.clear()

    @property
    def has_open(self) -> bool:
        return bool(self._open)

    def phase(self, event: Event) -> None:
        """Open or close the phase range that ``event`` starts or ends."""
        opening = _CLOSED_BY.get(event)
        if opening in self._open:
            self._open.pop(opening).__exit__(None, None, None)
        if event in PHASES and self.recording():
            marker = record_function(PHASES[event][0])
            marker.__enter__()
            self._open[event] = marker

    def close_all(self) -> None:
        """Close every open phase range (before the profiler stops)."""
        for marker in reversed(list(self._open.values())):
            marker.__exit__(None, None, None)
        self._open.clear()


class PhaseMarkers(Callback):
    """A callback for every event that opens and closes the phase ranges of `Markers`.

    Internal to the `Profiler` (never registered by name), so it has no config.
    """

    def __init__(self, markers: Markers) -> None:
        super().__init__()
        self.markers = markers

    def run_event(self, event: Event, state: Any, logger: Any) -> None:
        self.markers.phase(event)
