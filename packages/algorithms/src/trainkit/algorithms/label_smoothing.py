"""Label smoothing (Szegedy et al. 2016): train against ``(1 - s) * one_hot(y) + s / K``.

At BEFORE_LOSS the batch's targets are replaced by the smoothed distribution (K classes
read from the outputs' dim 1), and restored at AFTER_LOSS, so metrics and other methods
see the original targets. The model's loss must accept class probabilities as targets,
as ``F.cross_entropy`` does: for it, this equals ``cross_entropy(..., label_smoothing=s)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainkit.algorithms._batch import Key, get_item, set_item
from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.algorithms._targets import class_probabilities
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary

__all__ = ["LabelSmoothing", "LabelSmoothingConfig", "smooth_labels"]


@dataclass(kw_only=True)
class LabelSmoothingConfig:
    smoothing: float = primary(0.1)
    """Share of the probability spread uniformly over the classes; in [0, 1)."""
    target_key: Key = 1
    """Where the batch keeps its targets (a position or a dict key)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {self.smoothing}")


def smooth_labels(
    logits: torch.Tensor,
    target: torch.Tensor,
    config: LabelSmoothingConfig | None = None,
    /,
    **options: Any,
) -> torch.Tensor:
    """Smoothed class probabilities, shaped like ``logits`` (classes along dim 1).

    ``target`` is class indices (logits' shape without dim 1) or probabilities (logits'
    shape); either way the result is ``(1 - smoothing) * probabilities + smoothing / K``
    (K = ``logits.shape[1]``), with ``smoothing`` from the `LabelSmoothingConfig` or keyword
    arguments. It is float32 (float64 for float64 logits), whatever the autocast dtype.
    """
    smoothing = build_config(LabelSmoothingConfig, config, options).smoothing
    probabilities = class_probabilities(logits, target, "label_smoothing")
    return probabilities * (1.0 - smoothing) + smoothing / logits.shape[1]


class LabelSmoothing(ComposableAlgorithm, config=LabelSmoothingConfig):
    """Smooths the targets the loss sees (see `LabelSmoothingConfig`)."""

    config: LabelSmoothingConfig
    mixes_targets = True

    def __init__(self, config: LabelSmoothingConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._original: Any = None

    match_events = frozenset({Event.BEFORE_LOSS, Event.AFTER_LOSS})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        key = self.config.target_key
        if event == Event.BEFORE_LOSS:
            self._original = get_item(state.batch, key, "label_smoothing")
            smoothed = smooth_labels(state.outputs, self._original, self.config)
            state.batch = set_item(state.batch, key, smoothed)
        elif self._original is not None:
            state.batch = set_item(state.batch, key, self._original)
            self._original = None
