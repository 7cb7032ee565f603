"""Composition rules, as Engine ordering passes that algorithms declare.

An algorithm class says what it is with ``composition_role`` and lists these passes in
``ordering_passes``; the Engine registers each pass once for the whole run.

- ``"first"`` (e.g. selective_backprop: it chooses the samples the others see) runs first;
- ``"last"`` (the low-precision norms: they replace what other surgery produced) runs last;
- ``"interpolates_loss"`` (mixup, cutmix, label_smoothing): combining several of them
  mixes targets twice, which is rarely meant, so it is reported once.
"""

from __future__ import annotations

import warnings
from typing import Any

from trainkit.core import Event

__all__ = ["STANDARD_PASSES", "order_by_role", "warn_on_combined_loss_interpolation"]

_RANK = {"first": 0, "last": 2}


def order_by_role(algorithms: list[Any], event: Event) -> list[Any]:
    """Stable: "first" roles ahead, "last" roles behind, the rest in list order."""
    return sorted(algorithms, key=lambda a: _RANK.get(getattr(a, "composition_role", None), 1))


_warned: set[tuple[str, ...]] = set()


def warn_on_combined_loss_interpolation(algorithms: list[Any], event: Event) -> list[Any]:
    names = tuple(
        sorted(
            type(a).__name__
            for a in algorithms
            if getattr(a, "composition_role", None) == "interpolates_loss"
        )
    )
    if len(names) > 1 and names not in _warned:
        _warned.add(names)
        warnings.warn(
            f"{', '.join(names)} all interpolate targets or the loss; combined, they mix the "
            "targets more than once. Keep one of them unless that is what you want",
            stacklevel=2,
        )
    return algorithms


STANDARD_PASSES = (order_by_role, warn_on_combined_loss_interpolation)
