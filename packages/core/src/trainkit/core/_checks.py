"""Checks the engine runs on every component when it is registered (as pluggy's
``_verify_hook`` does): a mistake surfaces at construction, with the component's name."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Collection
from typing import Any

from trainkit.core._callback import ORDERS, Algorithm, Callback
from trainkit.core._destination import LoggerDestination
from trainkit.core._event import Event

__all__ = ["check_algorithm", "check_destination", "check_listener", "declared_required_events"]

_EVENT_NAMES = tuple(event.value for event in Event)
_CONTRACT_MODULES = (
    "trainkit.core._callback",
    "trainkit.core._destination",
    "trainkit.core.config",
)


def check_algorithm(algorithm: object) -> None:
    """Raise unless ``algorithm`` is an `Algorithm` with a known order and real events."""
    name, obj = type(algorithm).__name__, algorithm
    if not isinstance(algorithm, Algorithm):
        missing = [m for m in ("match", "apply") if not callable(getattr(obj, m, None))]
        detail = f" (it has no {' or '.join(missing)})" if missing else ""
        raise TypeError(
            f"{name} is not an Algorithm{detail}: subclass trainkit.core.Algorithm and define "
            "match(event, state) and apply(event, state, logger)"
        )
    if algorithm.order not in ORDERS:
        raise ValueError(
            f"algorithm {name}: order {algorithm.order!r} is not known; use one of "
            f"{', '.join(map(repr, ORDERS))}"
        )
    _check_required_events(algorithm, "algorithm")
    _check_match_events(algorithm)


def _check_match_events(algorithm: Algorithm) -> None:
    events = algorithm.match_events
    if events is None:
        return
    name = type(algorithm).__name__
    if isinstance(events, str) or not isinstance(events, Collection):
        raise TypeError(
            f"algorithm {name}: match_events must be a set of events (e.g. "
            f"frozenset({{Event.BATCH_END}})) or None for every event, got {events!r}"
        )
    for event in events:
        if event not in _EVENT_NAMES:
            raise ValueError(
                f"algorithm {name}: match_events names {event!r}, which is not an event; use "
                "Event members, e.g. Event.BATCH_END"
            )


def check_listener(listener: object, kind: str = "callback") -> None:
    """Raise for a callback (or destination) whose event methods name no event."""
    name = type(listener).__name__
    for method, close in _misspelled_event_methods(type(listener)):
        raise TypeError(
            f"{kind} {name} defines {method}(), which is not an event, so it would never be "
            f"called; did you mean {close}()? Events: {', '.join(_EVENT_NAMES)}"
        )
    if not isinstance(listener, Callback | LoggerDestination):
        handlers = [e for e in _EVENT_NAMES if callable(getattr(listener, e, None))]
        if not handlers and not callable(getattr(listener, "run_event", None)):
            raise TypeError(
                f"{kind} {name} defines no method named after an event (e.g. batch_end(state, "
                "logger)), so it would never run; subclass trainkit.core.Callback and override "
                "the events you need"
            )
    _check_required_events(listener, kind)


def check_destination(destination: object) -> None:
    if not isinstance(destination, LoggerDestination):
        raise TypeError(
            f"{type(destination).__name__} is not a LoggerDestination: subclass "
            "trainkit.core.LoggerDestination (its methods default to no-ops) and override "
            "log_metrics, log_hyperparameters, ... as needed"
        )
    check_listener(destination, "logger destination")


def declared_required_events(component: object) -> tuple[Any, ...]:
    """The events a component declared it needs (duck-typed callbacks declare none)."""
    if isinstance(component, Algorithm | Callback | LoggerDestination):
        return tuple(component.required_events)
    return ()


def _check_required_events(component: object, kind: str) -> None:
    for need in declared_required_events(component):
        options = need if isinstance(need, tuple) else (need,)
        for event in options:
            if event not in _EVENT_NAMES:
                raise ValueError(
                    f"{kind} {type(component).__name__}: required_events names {event!r}, "
                    f"which is not an event; use Event members, e.g. Event.BATCH_END"
                )


def _misspelled_event_methods(cls: type) -> list[tuple[str, str]]:
    """Public methods written by the component's author whose names are near an event's."""
    found = []
    seen: set[str] = set()
    for klass in cls.__mro__:
        if klass is object or klass.__module__ in _CONTRACT_MODULES:
            continue
        for attribute, value in vars(klass).items():
            if attribute in seen or attribute.startswith("_") or attribute in _EVENT_NAMES:
                continue
            seen.add(attribute)
            if not inspect.isfunction(value):
                continue
            close = difflib.get_close_matches(attribute, _EVENT_NAMES, n=1, cutoff=0.8)
            if close:
                found.append((attribute, close[0]))
    return found
