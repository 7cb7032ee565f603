"""Early stopping: stop training when a metric has not improved for a while.

A `Callback` (entry-point group ``trainkit.callbacks``). The metric is read after every
evaluation (``dataloader_label`` names the eval set) or, for ``"train"``, at the end of
every epoch. Training stops (``state.stop_training()``) once more than ``patience`` (epochs,
or a time in epochs or batches) has passed since the best value, as Composer's. Its state
is saved with the run, so a resumed run remembers the best value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainkit.algorithms._monitor import Mode, check_mode, check_monitor, improves, read_metric
from trainkit.core import Callback, Logger, State, TimeUnit, ensure_time

__all__ = ["EarlyStopper", "EarlyStopperConfig"]


@dataclass(kw_only=True)
class EarlyStopperConfig:
    monitor: str
    """Name of the metric to watch (as the model's ``get_metrics`` names it, e.g. "accuracy")."""
    dataloader_label: str = "eval"
    """Eval set whose metric is watched, or "train" for the training metric."""
    mode: str | None = None
    """"max" or "min" (Composer's ``comp`` strings "gt"/"greater", "lt"/"less" work too);
    None: "min" for names with loss, entropy, perplexity or error, else "max" (the
    stopper's ``mode`` is the one in use)."""
    min_delta: float = 0.0
    """A change must beat the best by more than this to count as improvement; >= 0."""
    patience: int | str = 1
    """How long the metric may go without improving: stop once more than this has passed
    since the best value. An int counts epochs (as Composer); or a time ('2ep', '500ba')."""

    def __post_init__(self) -> None:
        check_mode(self.monitor, self.mode)
        if not self.min_delta >= 0:
            raise ValueError(f"min_delta must be non-negative, got {self.min_delta}")
        if isinstance(self.patience, bool) or (
            isinstance(self.patience, int) and self.patience < 1
        ):
            raise ValueError(
                f"patience must be a positive int or a time such as '2ep', got {self.patience!r}"
            )
        if isinstance(self.patience, str):
            time = ensure_time(self.patience, "patience")
            if time.unit not in (TimeUnit.EPOCH, TimeUnit.BATCH) or time.value < 1:
                raise ValueError(
                    f"patience {self.patience!r} must be a positive number of epochs or batches"
                )


class EarlyStopper(
    Callback,
    config=EarlyStopperConfig,
    positional=("monitor", "dataloader_label", "mode", "min_delta", "patience"),
):
    """Stops training when ``monitor`` stops improving (see `EarlyStopperConfig`).

    Composer's positional order works: ``EarlyStopper("MulticlassAccuracy", "eval")``.
    """

    config: EarlyStopperConfig

    def __init__(
        self, config: EarlyStopperConfig | None = None, /, *values: Any, **options: Any
    ) -> None:
        super().__init__(config, *values, **options)
        cfg = self.config
        self.mode: Mode = check_mode(cfg.monitor, cfg.mode)
        """The direction in use: the configured ``mode``, or the one inferred from the name."""
        self.best: float | None = None
        self.best_at = 0  # in epochs or batches (the unit of patience)
        self.checks = 0
        patience = ensure_time(cfg.patience, "patience")
        self._unit, self._patience = patience.unit, patience.value

    def fit_start(self, state: State, logger: Logger) -> None:
        check_monitor(state, self.config.dataloader_label, self.config.monitor, "EarlyStopper")

    def epoch_end(self, state: State, logger: Logger) -> None:
        if self.config.dataloader_label == "train":
            self._check(state, logger)

    def eval_after_all(self, state: State, logger: Logger) -> None:
        if self.config.dataloader_label != "train":
            self._check(state, logger)

    def _check(self, state: State, logger: Logger) -> None:
        cfg = self.config
        value = read_metric(state, cfg.dataloader_label, cfg.monitor)
        self.checks += 1
        now = state.timestamp.get(self._unit)
        if improves(value, self.best, self.mode, cfg.min_delta):
            self.best, self.best_at = value, now
        elif now - self.best_at > self._patience:
            logger.log_metrics({"early_stopper/stopped_at_batch": state.timestamp.batch})
            state.stop_training()

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_at": self.best_at, "checks": self.checks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_at, self.checks = state["best"], state["best_at"], state["checks"]
