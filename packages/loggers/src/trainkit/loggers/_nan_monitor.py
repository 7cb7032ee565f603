"""`NaNMonitor`: stop training with an error naming the batch whose loss was not finite."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainkit.core import Callback, Event, Logger, State, Time
from trainkit.core.interval import interval_trigger
from trainkit.loggers._common import check_interval

__all__ = ["NaNMonitor", "NaNMonitorConfig"]


@dataclass(kw_only=True)
class NaNMonitorConfig:
    check_interval: str | int | Time = "1ba"
    """How often to read the check: ``"1ba"`` (waits for the device every batch),
    ``"20ba"`` (stops up to 19 batches later, without the per-batch wait), ``"1ep"``, ..."""

    def __post_init__(self) -> None:
        check_interval(self.check_interval)


class NaNMonitor(Callback, config=NaNMonitorConfig):
    """Raises `FloatingPointError` when the training loss is NaN or infinite.

    Every batch's loss is checked on the device (no sync); the result is read every
    ``check_interval``, and at the end of `fit`. The error names the first bad batch, even
    when it is read later: ``the training loss is nan at batch 37 (epoch 2, batch 5 of the
    epoch)``. Batches are counted from 1, as the logged steps are. With the default
    ``"1ba"`` the check waits for the device once per batch; on a GPU, ``"20ba"`` avoids
    that at the cost of stopping up to 19 batches later. Options: `NaNMonitorConfig`.
    """

    config: NaNMonitorConfig
    required_events = (Event.AFTER_TRAIN_BATCH,)

    def __init__(self, config: NaNMonitorConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._trigger = interval_trigger(self.config.check_interval, at_end=False)
        self._first_bad: torch.Tensor | None = None  # global batch number, or -1
        self._value: torch.Tensor | None = None
        self._positions: dict[int, tuple[int, int]] = {}

    def after_train_batch(self, state: State, logger: Logger) -> None:
        loss = state.total_loss
        if loss is None:
            return
        loss = loss.detach().reshape(-1)[0].float()
        ts = state.timestamp
        number = ts.batch + 1
        self._positions[number] = (ts.epoch, ts.batch_in_epoch + 1)
        if self._first_bad is None or self._value is None:
            self._first_bad = torch.full((), -1, dtype=torch.int64, device=loss.device)
            self._value = torch.zeros((), device=loss.device)
        new = ~torch.isfinite(loss) & (self._first_bad < 0)
        self._first_bad = torch.where(new, number, self._first_bad)
        self._value = torch.where(new, loss, self._value)

    def batch_end(self, state: State, logger: Logger) -> None:
        if self._trigger(state, Event.BATCH_END):
            self._check()

    def epoch_end(self, state: State, logger: Logger) -> None:
        if self._trigger(state, Event.EPOCH_END):
            self._check()

    def fit_end(self, state: State, logger: Logger) -> None:
        self._check()

    def _check(self) -> None:
        if self._first_bad is None or self._value is None:
            return
        bad = int(self._first_bad)  # the one device sync
        if bad < 0:
            self._positions.clear()
            return
        epoch, in_epoch = self._positions.get(bad, (-1, -1))
        where = f" (epoch {epoch}, batch {in_epoch} of the epoch)" if epoch >= 0 else ""
        raise FloatingPointError(
            f"the training loss is {float(self._value)} at batch {bad}{where}; training "
            "stopped. Look at that batch's data, lower the learning rate, or clip gradients"
        )
