"""Selective backprop (Jiang et al. 2019): train mostly on the samples with a high loss.

At BATCH_START (on the device, before microbatching) a forward pass without gradients
scores every sample, on inputs downscaled by ``scale_factor`` when it is below 1. The
samples are ranked by loss; the one at rank ``i`` of ``N`` (ascending) has the loss
percentile ``p_i = (i + 0.5) / N`` and is drawn with probability proportional to
``p_i ** (1 / keep - 1)``; ``floor(keep * N)`` samples (at least 1) are drawn without
replacement, and the step runs on those at full size. This is the paper's rule as
Composer applies it, with percentiles taken within the batch (the paper ranks each loss
among a history of recent losses). Selection applies from
``start`` to ``end`` of training, except on every ``interrupt``-th batch of an epoch,
which trains on all samples. The scoring pass runs in training mode, as the step will
(so it also updates batch-norm statistics, as in Composer). It runs before the other
methods (``order = "first"``), so they see only the samples kept. Progress is still
counted in the samples loaded.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from trainkit.algorithms._batch import Key, get_item, index_batch, set_item
from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary

__all__ = [
    "SelectiveBackprop",
    "SelectiveBackpropConfig",
    "downscale",
    "per_sample_losses",
    "select_high_loss",
    "selection_probabilities",
    "should_select",
]

PerSampleLoss = Callable[[Any, Any], torch.Tensor]
"""``(outputs, batch) -> losses`` of shape (N,)."""

_INTERPOLATION = {3: "linear", 4: "bilinear", 5: "trilinear"}


@dataclass(kw_only=True)
class SelectiveBackpropConfig:
    start: float = primary(0.5)
    """Fraction of training at which selection begins; in [0, 1]."""
    end: float = 0.9
    """Fraction of training at which it ends; above ``start``, at most 1."""
    keep: float = 0.5
    """Share of each batch kept, ``floor(keep * N)`` samples (at least 1); in (0, 1]. With
    1 every sample is kept and no scoring pass runs."""
    scale_factor: float = 1.0
    """The scoring pass sees the inputs resized by this factor (linear, bilinear or
    trilinear for 3-D, 4-D or 5-D inputs); the step uses them at full size; in (0, 1]."""
    interrupt: int = 2
    """Every ``interrupt``-th batch of an epoch in the window trains on all samples; 0 for
    none."""
    input_key: Key = 0
    """Where the batch keeps the inputs that ``scale_factor`` resizes."""
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
        if not 0.0 < self.scale_factor <= 1.0:
            raise ValueError(f"scale_factor must be in (0, 1], got {self.scale_factor}")
        if (
            isinstance(self.interrupt, bool)
            or not isinstance(self.interrupt, int)
            or self.interrupt < 0
        ):
            raise ValueError(f"interrupt must be a non-negative int, got {self.interrupt!r}")


def should_select(
    elapsed: float,
    batch_in_epoch: int,
    config: SelectiveBackpropConfig | None = None,
    /,
    **options: Any,
) -> bool:
    """Whether batch number ``batch_in_epoch`` (0-based, counted in its epoch, as Composer)
    at ``elapsed`` of training is cut.

    Takes a `SelectiveBackpropConfig` or its fields as keyword arguments.
    """
    cfg = build_config(SelectiveBackpropConfig, config, options)
    in_window = cfg.start <= elapsed < cfg.end
    interrupted = cfg.interrupt != 0 and (batch_in_epoch + 1) % cfg.interrupt == 0
    return cfg.keep < 1.0 and in_window and not interrupted


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


def downscale(x: torch.Tensor, scale_factor: float) -> torch.Tensor:
    """``x`` (N, C, ...spatial) resized by ``scale_factor`` for the scoring pass (as Composer)."""
    if scale_factor == 1.0:
        return x
    if x.ndim not in _INTERPOLATION:
        raise ValueError(
            f"selective_backprop's scale_factor resizes inputs shaped (N, C, L), (N, C, H, W) "
            f"or (N, C, D, H, W); got shape {tuple(x.shape)}. Use scale_factor=1"
        )
    return F.interpolate(
        x,
        scale_factor=scale_factor,
        mode=_INTERPOLATION[x.ndim],
        align_corners=False,
        recompute_scale_factor=False,
    )


def selection_probabilities(n: int, keep: float) -> torch.Tensor:
    """The weight of each loss rank (0: lowest loss) in the draw, shape (n,), summing to 1.

    Rank ``i`` has percentile ``(i + 0.5) / n`` and weight ``percentile ** (1 / keep - 1)``.
    """
    percentiles = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    weights = percentiles ** (1.0 / keep - 1.0)
    return weights / weights.sum()


def select_high_loss(
    batch: Any,
    losses: torch.Tensor,
    config: SelectiveBackpropConfig | None = None,
    /,
    *,
    generator: torch.Generator | None = None,
    **options: Any,
) -> tuple[Any, torch.Tensor]:
    """Draw ``floor(keep * N)`` samples (at least 1) without replacement, by loss percentile.

    ``keep`` comes from the `SelectiveBackpropConfig` or keyword arguments; the draw uses
    ``generator`` (default: torch's global CPU generator). Returns ``(kept batch, kept
    indices)``; the kept samples stay in their original order.
    """
    keep = build_config(SelectiveBackpropConfig, config, options).keep
    n = losses.shape[0]
    count = max(1, math.floor(keep * n + 1e-9))
    by_loss = torch.argsort(losses.detach().float())
    if count >= n:
        indices = by_loss.sort().values
    else:
        ranks = torch.multinomial(
            selection_probabilities(n, keep), count, replacement=False, generator=generator
        )
        indices = by_loss[ranks.to(by_loss.device)].sort().values
    return index_batch(batch, indices), indices


class SelectiveBackprop(ComposableAlgorithm, config=SelectiveBackpropConfig):
    """Trains mostly on the high-loss samples of each batch (see `SelectiveBackpropConfig`).

    Differences from Composer: the draw uses torch's generator (saved in checkpoints, so a
    resumed run draws the same samples) instead of numpy's; at least one sample is kept; the
    kept samples stay in their original order; the per-sample loss is the model's own
    ``loss`` on each sample unless ``per_sample_loss`` is given.
    """

    config: SelectiveBackpropConfig
    order = "first"

    def __init__(self, config: SelectiveBackpropConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self.kept: torch.Tensor | None = None
        """Indices kept from the last batch (None when it was not cut)."""

    match_events = frozenset({Event.BATCH_START})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        cfg = self.config
        self.kept = None
        if not should_select(state.elapsed_fraction(), state.timestamp.batch_in_epoch, cfg):
            return
        model = state.parallelism.unwrap(state.model)
        scored = state.batch
        if cfg.scale_factor != 1.0:
            x = get_item(scored, cfg.input_key, "selective_backprop")
            scored = set_item(scored, cfg.input_key, downscale(x, cfg.scale_factor))
        with torch.no_grad(), state.precision.autocast():
            outputs = state.model(scored)
            if cfg.per_sample_loss is not None:
                losses = cfg.per_sample_loss(outputs, scored)
            else:
                losses = per_sample_losses(model, outputs, scored)
        state.batch, self.kept = select_high_loss(state.batch, losses, cfg)
