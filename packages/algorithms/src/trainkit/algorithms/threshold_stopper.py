"""Threshold stopping: stop training as soon as a metric reaches a target value.

A `Callback` (entry-point group ``trainkit.callbacks``). The metric is read after every
evaluation (``dataloader_label`` names the eval set) or, for ``"train"``, at the end of
every epoch (or every batch, with ``stop_on_batch``); once it is beyond ``threshold``
(strictly above for "max", below for "min", as Composer's), training stops
(``state.stop_training()``) after the current batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trainkit.algorithms._monitor import Mode, check_mode, check_monitor, read_metric
from trainkit.core import Callback, Logger, State

__all__ = ["ThresholdStopper", "ThresholdStopperConfig"]


@dataclass(kw_only=True)
class ThresholdStopperConfig:
    monitor: str
    """Name of the metric to watch (as the model's ``get_metrics`` names it, e.g. "accuracy")."""
    threshold: float
    """Stop once the metric reaches this value; finite."""
    dataloader_label: str = "eval"
    """Eval set whose metric is watched, or "train" for the training metric."""
    mode: str | None = None
    """"max": stop at values > threshold; "min": at values < threshold (Composer's ``comp``
    strings "gt"/"greater", "lt"/"less" work too); None infers "min" for names with loss,
    entropy, perplexity or error, else "max"."""
    stop_on_batch: bool = False
    """For a training metric (``dataloader_label="train"``), check after every batch
    instead of every epoch."""

    def __post_init__(self) -> None:
        check_mode(self.monitor, self.mode)
        if not isinstance(self.threshold, int | float) or not math.isfinite(self.threshold):
            raise ValueError(f"threshold must be a finite number, got {self.threshold!r}")


class ThresholdStopper(
    Callback,
    config=ThresholdStopperConfig,
    positional=("monitor", "dataloader_label", "threshold"),
):
    """Stops training once ``monitor`` passes ``threshold`` (see `ThresholdStopperConfig`).

    Composer's positional order works: ``ThresholdStopper("MulticlassAccuracy", "eval", 0.9)``.
    """

    config: ThresholdStopperConfig

    def __init__(
        self, config: ThresholdStopperConfig | None = None, /, *values: Any, **options: Any
    ) -> None:
        super().__init__(config, *values, **options)
        self.mode: Mode = check_mode(self.config.monitor, self.config.mode)
        """The direction in use: the configured ``mode``, or the one inferred from the name."""

    def fit_start(self, state: State, logger: Logger) -> None:
        check_monitor(state, self.config.dataloader_label, self.config.monitor, "ThresholdStopper")

    def epoch_end(self, state: State, logger: Logger) -> None:
        if self.config.dataloader_label == "train" and not self.config.stop_on_batch:
            self._check(state)

    def batch_end(self, state: State, logger: Logger) -> None:
        if self.config.dataloader_label == "train" and self.config.stop_on_batch:
            self._check(state)

    def eval_after_all(self, state: State, logger: Logger) -> None:
        if self.config.dataloader_label != "train":
            self._check(state)

    def _check(self, state: State) -> None:
        cfg = self.config
        value = read_metric(state, cfg.dataloader_label, cfg.monitor)
        reached = value > cfg.threshold if self.mode == "max" else value < cfg.threshold
        if reached:
            state.stop_training()
