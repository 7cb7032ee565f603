"""Composition rules: what the methods of this package declare, and the pass that reads it.

Order is core's business (``Algorithm.order``: selective_backprop is ``"first"``, the
low-precision norms are ``"last"``). What is left here is a rule about targets: mixup,
cutmix and label_smoothing each interpolate the targets (or the loss); combined, they mix
the targets more than once, which is rarely meant, so it is reported once. A method says
it does so with ``mixes_targets = True`` on `ComposableAlgorithm`, which also registers
the pass (``ordering_passes``).
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

from trainkit.core import Algorithm, Event

__all__ = ["STANDARD_PASSES", "ComposableAlgorithm", "warn_on_combined_loss_interpolation"]

_warned: set[tuple[str, ...]] = set()


def warn_on_combined_loss_interpolation(algorithms: list[Any], event: Event) -> list[Any]:
    """Warn (once per combination) when several matched methods declare ``mixes_targets``."""
    names = tuple(
        sorted(
            type(a).__name__
            for a in algorithms
            if isinstance(a, ComposableAlgorithm) and a.mixes_targets
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


def _declared(cls: type) -> set[str]:
    # Names the class, or a base below ComposableAlgorithm, defines itself.
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is ComposableAlgorithm:
            break
        names.update(vars(klass))
    return names


STANDARD_PASSES = (warn_on_combined_loss_interpolation,)
"""The ordering passes every method of this package registers."""


class ComposableAlgorithm(Algorithm):
    """An `Algorithm` that takes part in this package's composition rules.

    Every method of trainkit-algorithms subclasses it; a third-party method may too, to be
    counted by the rules (otherwise subclass `trainkit.core.Algorithm` directly).
    """

    ordering_passes = STANDARD_PASSES

    mixes_targets: ClassVar[bool] = False
    """The method interpolates the targets or the loss (mixup, cutmix, label smoothing):
    combining two such methods warns."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.match is ComposableAlgorithm.match and "match_events" not in _declared(cls):
            raise TypeError(
                f"{cls.__name__} declares neither match_events nor match(event, state): declare "
                "the events it runs at (match_events = frozenset({Event.BATCH_END})), or "
                "define match"
            )

    def match(self, event: Event, state: Any) -> bool:
        """Yes at each of ``match_events`` (which the engine asks it at only): a method that
        runs at those events whatever the state needs nothing more."""
        return event in self.match_events  # type: ignore[operator]
