"""`LRMonitor`: the learning rate of every optimizer parameter group."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trainkit.core import Callback, Event, Logger, State, Time
from trainkit.core.interval import interval_trigger
from trainkit.loggers._common import check_interval

__all__ = ["LRMonitor", "LRMonitorConfig", "optimizer_names"]


@dataclass(kw_only=True)
class LRMonitorConfig:
    interval: str | int | Time = "1ba"
    """How often to log: ``"1ba"``, ``"10ba"``, ``"1ep"``, ..."""

    def __post_init__(self) -> None:
        check_interval(self.interval)


def optimizer_names(optimizers: Sequence[torch.optim.Optimizer]) -> list[str]:
    """``["AdamW", "SGD", "SGD.1"]``: class names, numbered when repeated."""
    names, seen = [], {}
    for optimizer in optimizers:
        name = type(optimizer).__name__
        seen[name] = seen.get(name, -1) + 1
        names.append(name if seen[name] == 0 else f"{name}.{seen[name]}")
    return names


class LRMonitor(Callback, config=LRMonitorConfig):
    """Logs ``lr-<Optimizer>/group<i>`` (Composer's key) for every parameter group, every ``interval``.

    The value is the one the next optimizer step will use (read after the schedulers
    stepped). A learning rate held in a tensor is logged as the tensor: no device sync.
    Options: `LRMonitorConfig`.
    """

    config: LRMonitorConfig

    def __init__(self, config: LRMonitorConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._trigger = interval_trigger(self.config.interval, at_end=False)

    def batch_end(self, state: State, logger: Logger) -> None:
        if self._trigger(state, Event.BATCH_END):
            self._log(state, logger)

    def epoch_end(self, state: State, logger: Logger) -> None:
        if self._trigger(state, Event.EPOCH_END):
            self._log(state, logger)

    @staticmethod
    def _log(state: State, logger: Logger) -> None:
        logger.log_metrics(
            {
                f"lr-{name}/group{index}": group["lr"]
                for name, optimizer in zip(
                    optimizer_names(state.optimizers), state.optimizers, strict=True
                )
                for index, group in enumerate(optimizer.param_groups)
            }
        )
