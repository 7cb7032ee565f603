"""Sequence length warmup (Li et al. 2022): train on short sequences first, then longer.

For dict batches with ``input_ids`` of shape (N, L). Over the first ``duration`` of
training the length grows linearly from ``min_seq_length`` to ``max_seq_length`` in steps
of ``step_size``; every tensor of the batch shaped (N, L, ...) (``attention_mask``,
``labels``, ...) is cut to it at AFTER_DATALOADER, so the run's token count counts the
tokens actually trained on. ``truncate=False`` keeps every token instead, reshaping each
sequence into several shorter ones (the trailing remainder is dropped).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary

__all__ = [
    "SeqLengthWarmup",
    "SeqLengthWarmupConfig",
    "set_batch_sequence_length",
    "warmup_sequence_length",
]


@dataclass(kw_only=True)
class SeqLengthWarmupConfig:
    duration: float = primary(0.3)
    """Fraction of training over which the length grows to ``max_seq_length``; in (0, 1]."""
    min_seq_length: int = 8
    """Length at the start; positive and a multiple of ``step_size``."""
    max_seq_length: int = 1024
    """Length at the end of the warmup; at least ``min_seq_length``."""
    step_size: int = 8
    """Lengths are multiples of this (8 suits tensor cores); positive."""
    truncate: bool = True
    """Cut sequences (True) or reshape them into several shorter ones (False)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.duration <= 1.0:
            raise ValueError(f"duration must be in (0, 1], got {self.duration}")
        if self.step_size < 1 or self.min_seq_length < 1:
            raise ValueError(
                f"step_size and min_seq_length must be positive, got {self.step_size} and {self.min_seq_length}"
            )
        if self.min_seq_length % self.step_size:
            raise ValueError(
                f"min_seq_length {self.min_seq_length} is not a multiple of step_size {self.step_size}"
            )
        if self.max_seq_length < self.min_seq_length:
            raise ValueError(
                f"max_seq_length {self.max_seq_length} is below min_seq_length {self.min_seq_length}"
            )


def warmup_sequence_length(
    elapsed: float, config: SeqLengthWarmupConfig | None = None, /, **options: Any
) -> int:
    """The sequence length once ``elapsed`` (0 to 1) of training is done.

    Takes a `SeqLengthWarmupConfig` or its fields as keyword arguments.
    """
    config = build_config(SeqLengthWarmupConfig, config, options)
    if elapsed >= config.duration:
        return config.max_seq_length
    grown = (config.max_seq_length - config.min_seq_length) * elapsed / config.duration
    length = config.min_seq_length + int(grown) // config.step_size * config.step_size
    return min(length, config.max_seq_length)


def set_batch_sequence_length(
    batch: Mapping[str, Any],
    length: int,
    config: SeqLengthWarmupConfig | None = None,
    /,
    **options: Any,
) -> dict[str, Any]:
    """The batch with sequences of at most ``length``: cut, or reshaped into more rows.

    Every tensor shaped like ``input_ids`` in its first two dims changes; others are kept.
    ``truncate`` comes from the `SeqLengthWarmupConfig` or keyword arguments.
    """
    truncate = build_config(SeqLengthWarmupConfig, config, options).truncate
    if not isinstance(batch, Mapping) or not isinstance(batch.get("input_ids"), torch.Tensor):
        raise ValueError(
            "seq_length_warmup needs dict batches with an 'input_ids' tensor shaped (N, L); "
            f"got {type(batch).__name__}"
            + (f" with keys {sorted(batch)}" if isinstance(batch, Mapping) else "")
        )
    if length < 1:
        raise ValueError(f"length must be positive, got {length}")
    n, current = batch["input_ids"].shape[:2]
    if current <= length:
        return dict(batch)
    usable = current // length * length
    out = {}
    for key, value in batch.items():
        if (
            isinstance(value, torch.Tensor)
            and value.ndim >= 2
            and tuple(value.shape[:2]) == (n, current)
        ):
            if truncate:
                value = value[:, :length]
            else:
                value = value[:, :usable].reshape(n * (usable // length), length, *value.shape[2:])
        out[key] = value
    return out


class SeqLengthWarmup(ComposableAlgorithm, config=SeqLengthWarmupConfig):
    """Grows the training sequence length on schedule (see `SeqLengthWarmupConfig`)."""

    config: SeqLengthWarmupConfig

    def __init__(self, config: SeqLengthWarmupConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    match_events = frozenset({Event.AFTER_DATALOADER})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        length = warmup_sequence_length(state.elapsed_fraction(), self.config)
        state.batch = set_batch_sequence_length(state.batch, length, self.config)
