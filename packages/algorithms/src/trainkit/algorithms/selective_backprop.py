"""Selective backprop (Jiang et al. 2019): train only on the samples with the highest loss.

At BATCH_START (on the device, before microbatching) a forward pass without gradients
scores every sample; the batch is cut to the ``keep`` share with the highest loss, and
the step runs on those (the scoring pass runs in training mode, as the step will, so it
also updates batch-norm statistics). It applies between ``start`` and ``end`` of training, except on
every ``interrupt``-th batch, which trains on all samples. It runs before the other
methods (``order = "first"``), so they see only the samples kept. Progress is still
counted in the samples loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainkit.algorithms._batch import index_batch
from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config

__all__ = [
    "SelectiveBackprop",
    "SelectiveBackpropConfig",
    "per_sample_losses",
    "select_high_loss",
    "should_select",
]

PerSampleLoss = Callable[[Any, Any], torch.Tensor]
"""``(outputs, batch) -> losses`` of shape (N,)."""


@dataclass(kw_only=True)
class SelectiveBackpropConfig:
    start: float = 0.5
    """Fraction of training at which selection begins; in [0, 1]."""
    end: float = 0.9
    """Fraction of training at which it ends; above ``start``, at most 1."""
    keep: float = 0.5
    """Share of each batch kept (the highest-loss samples); in (0, 1]."""
    interrupt: int = 2
    """Every ``interrupt``-th batch in the window trains on all samples; 0 for none."""
    per_sample_loss: PerSampleLoss | None = None
    """Per-sample losses from outputs and batch; default: the model's ``loss`` on each
    sample in turn (any model whose outputs have the samples along dim 0). Pass e.g.
    ``lambda out, b: F.cross_entropy(out, b[1], reduction="none")`` for speed."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.start < self.end <= 1.0:
            raise ValueError(
                f"start and end must satisfy 0 <= start < end <= 1, got start={self.start}, end={self.end}"
            )
        if not 0.0 < self.keep <= 1.0:
            raise ValueError(f"keep must be in (0, 1], got {self.keep}")
        if (
            isinstance(self.interrupt, bool)
            or not isinstance(self.interrupt, int)
            or self.interrupt < 0
        ):
            raise ValueError(f"interrupt must be a non-negative int, got {self.interrupt!r}")


def should_select(
    elapsed: float,
    batch: int,
    config: SelectiveBackpropConfig | None = None,
    /,
    **options: Any,
) -> bool:
    """Whether batch number ``batch`` (0-based), at ``elapsed`` of training, is cut.

    Takes a `SelectiveBackpropConfig` or its fields as keyword arguments.
    """
    cfg = build_config(SelectiveBackpropConfig, config, options)
    in_window = cfg.start <= elapsed < cfg.end
    return in_window and (cfg.interrupt == 0 or (batch + 1) % cfg.interrupt != 0)


def per_sample_losses(model: Any, outputs: Any, batch: Any) -> torch.Tensor:
    """The model's ``loss`` on each sample in turn, shape (N,)."""
    first = outputs if isinstance(outputs, torch.Tensor) else next(iter(_tensors(outputs)), None)
    if first is None or first.ndim == 0:
        raise ValueError(
            "selective_backprop needs outputs with the samples along dim 0 to score each "
            "sample; pass per_sample_loss=(outputs, batch) -> losses of shape (N,)"
        )
    rows = [torch.tensor([i], device=first.device) for i in range(first.shape[0])]
    return torch.stack([model.loss(index_batch(outputs, r), index_batch(batch, r)) for r in rows])


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list | tuple) else []
    return [t for v in values for t in _tensors(v)]


def select_high_loss(
    batch: Any,
    losses: torch.Tensor,
    config: SelectiveBackpropConfig | None = None,
    /,
    **options: Any,
) -> tuple[Any, torch.Tensor]:
    """Keep the ``round(keep * N)`` (at least 1) samples with the highest ``losses``.

    ``keep`` comes from the `SelectiveBackpropConfig` or keyword arguments. Returns
    ``(kept batch, kept indices)``; the kept samples stay in their original order.
    """
    keep = build_config(SelectiveBackpropConfig, config, options).keep
    count = max(1, round(keep * losses.shape[0]))
    indices = torch.topk(losses.detach().float(), count).indices.sort().values
    return index_batch(batch, indices), indices


class SelectiveBackprop(ComposableAlgorithm, config=SelectiveBackpropConfig):
    """Trains on the highest-loss samples of each batch (see `SelectiveBackpropConfig`)."""

    config: SelectiveBackpropConfig
    order = "first"

    def __init__(self, config: SelectiveBackpropConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self.kept: torch.Tensor | None = None
        """Indices kept from the last batch (None when it was not cut)."""

    def match(self, event: Event, state: State) -> bool:
        return event == Event.BATCH_START

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        cfg = self.config
        self.kept = None
        if not should_select(state.elapsed_fraction(), state.timestamp.batch, cfg):
            return
        model = state.parallelism.unwrap(state.model)
        with torch.no_grad(), state.precision.autocast():
            outputs = state.model(state.batch)
            if cfg.per_sample_loss is not None:
                losses = cfg.per_sample_loss(outputs, state.batch)
            else:
                losses = per_sample_losses(model, outputs, state.batch)
        state.batch, self.kept = select_high_loss(state.batch, losses, cfg)
