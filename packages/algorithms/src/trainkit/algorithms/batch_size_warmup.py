"""Batch-size warmup: train the first part of the run on a fraction of each batch.

Over the first ``duration`` of training the number of samples trained on per batch grows
linearly from ``initial_fraction`` of the batch to all of it, rounded down to a multiple
of ``multiple_of``. At AFTER_DATALOADER every tensor of the batch whose first dim is the
batch's sample count is cut to the first samples (as `SeqLengthWarmup` cuts the length),
so the run's sample and token counts are those trained on, and ``'500sp'`` /
``'1000000tok'`` warmups count them. The rest of each batch is skipped, not kept for a
later step: an epoch under warmup trains on fewer samples. Large-batch runs (GPT-3 grows
its batch over the first tokens) start small because early in training a small batch's
step is nearly as good as a large one's, for less compute. The learning rate is left to
the scheduler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State, TimeUnit, ensure_time
from trainkit.core.config import build_config, primary

__all__ = ["BatchSizeWarmup", "BatchSizeWarmupConfig", "set_batch_size", "warmup_batch_size"]

_UNITS = (TimeUnit.DURATION, TimeUnit.BATCH, TimeUnit.SAMPLE, TimeUnit.TOKEN)


@dataclass(kw_only=True)
class BatchSizeWarmupConfig:
    duration: str = primary("0.1dur")
    """How long the batch grows: a fraction of training (``'0.1dur'``, in (0, 1]), or
    batches, samples or tokens trained on (``'500ba'``, ``'64000sp'``, ``'1000000tok'``)."""
    initial_fraction: float = 0.125
    """Share of each batch trained on at the start; in (0, 1]."""
    multiple_of: int = 1
    """Sizes are multiples of this (at least one multiple; a batch smaller than it is
    kept whole); positive."""

    def __post_init__(self) -> None:
        length = ensure_time(self.duration, "duration")
        if length.unit not in _UNITS or length.value <= 0:
            raise ValueError(
                f"duration {self.duration!r} must be a positive fraction of training, batches, "
                "samples or tokens, e.g. '0.1dur', '500ba', '64000sp' or '1000000tok'"
            )
        if length.unit == TimeUnit.DURATION and length.value > 1:
            raise ValueError(f"duration must be within (0dur, 1dur], got {self.duration!r}")
        if not 0.0 < self.initial_fraction <= 1.0:
            raise ValueError(f"initial_fraction must be in (0, 1], got {self.initial_fraction}")
        if self.multiple_of < 1:
            raise ValueError(f"multiple_of must be positive, got {self.multiple_of}")


def warmup_batch_size(
    progress: float, full_size: int, config: BatchSizeWarmupConfig | None = None, /, **options: Any
) -> int:
    """Samples to train on out of ``full_size`` once ``progress`` (0 to 1) of the warmup is done.

    Takes a `BatchSizeWarmupConfig` or its fields as keyword arguments.
    """
    cfg = build_config(BatchSizeWarmupConfig, config, options)
    step = cfg.multiple_of
    if progress >= 1.0 or full_size <= step:
        return full_size
    fraction = cfg.initial_fraction + (1.0 - cfg.initial_fraction) * max(progress, 0.0)
    size = int(fraction * full_size / step + 1e-9) * step  # 1e-9: 0.625 * 16 is 10, not 9.99
    return min(max(size, step), full_size)


def _samples(batch: Any) -> int:
    values = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(batch, Mapping | tuple | list):
        for value in values:
            if isinstance(value, torch.Tensor) and value.ndim >= 1:
                return value.shape[0]
    raise ValueError(
        "batch_size_warmup needs a dict, tuple or list batch holding tensors with the samples "
        f"along dim 0; got {type(batch).__name__}"
    )


def set_batch_size(batch: Any, size: int) -> Any:
    """The batch cut to its first ``size`` samples (a batch of that many or fewer is kept).

    The sample count is the first dim of the batch's first tensor; every tensor with that
    first dim is cut, other values are kept. Dict, tuple and list batches keep their type.
    """
    if size < 1:
        raise ValueError(f"size must be positive, got {size}")
    n = _samples(batch)
    if n <= size:
        return batch

    def cut(value: Any) -> Any:
        is_batched = isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] == n
        return value[:size] if is_batched else value

    if isinstance(batch, Mapping):
        return {key: cut(value) for key, value in batch.items()}
    values = [cut(value) for value in batch]
    return type(batch)(*values) if hasattr(batch, "_fields") else type(batch)(values)


class BatchSizeWarmup(ComposableAlgorithm, config=BatchSizeWarmupConfig):
    """Grows the share of each batch trained on (see `BatchSizeWarmupConfig`)."""

    config: BatchSizeWarmupConfig

    def __init__(self, config: BatchSizeWarmupConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._length = ensure_time(self.config.duration, "duration")

    match_events = frozenset({Event.AFTER_DATALOADER})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        unit, length = self._length.unit, self._length.value
        done = state.elapsed_fraction() if unit == TimeUnit.DURATION else state.timestamp.get(unit)
        if done >= length:
            return
        size = warmup_batch_size(done / length, _samples(state.batch), self.config)
        state.batch = set_batch_size(state.batch, size)
