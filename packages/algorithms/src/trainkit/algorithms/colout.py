"""ColOut: drop random rows and columns of the training images (a cheap, shrinking augmentation).

At BATCH_START ``round(p_row * H)`` rows and ``round(p_col * W)`` columns, chosen at
random per batch, are removed from every image (the same for the whole batch, so it
stays one tensor); the rest keep their order. Images get smaller, so steps get cheaper.
Segmentation masks can lose the same rows and columns (``resize_targets``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainkit.algorithms._batch import Key, get_item, set_item
from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config

__all__ = ["ColOut", "ColOutConfig", "colout_batch"]


@dataclass(kw_only=True)
class ColOutConfig:
    p_row: float = 0.15
    """Share of rows dropped; in [0, 1)."""
    p_col: float = 0.15
    """Share of columns dropped; in [0, 1)."""
    resize_targets: bool = False
    """Drop the same rows and columns from the targets (segmentation masks)."""
    input_key: Key = 0
    """Where the batch keeps its images, shaped (N, C, H, W)."""
    target_key: Key = 1
    """Where the batch keeps its targets."""

    def __post_init__(self) -> None:
        for name in ("p_row", "p_col"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")


def _kept(size: int, p: float, device: torch.device) -> torch.Tensor:
    keep = size - round(p * size)
    return torch.randperm(size, device=device)[:keep].sort().values


def colout_batch(
    x: torch.Tensor,
    y: torch.Tensor | None = None,
    config: ColOutConfig | None = None,
    /,
    **options: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x`` (..., H, W) without ``round(p_row * H)`` random rows and ``round(p_col * W)`` columns.

    Takes a `ColOutConfig` or its fields as keyword arguments. Returns ``(x, y)``; with
    ``resize_targets``, ``y`` (..., H, W) loses the same ones.
    """
    cfg = build_config(ColOutConfig, config, options)
    p_row, p_col, resize_targets = cfg.p_row, cfg.p_col, cfg.resize_targets
    if x.ndim < 3:
        raise ValueError(f"colout needs images shaped (N, C, H, W), got shape {tuple(x.shape)}")
    rows, cols = _kept(x.shape[-2], p_row, x.device), _kept(x.shape[-1], p_col, x.device)
    x = x.index_select(-2, rows).index_select(-1, cols)
    if resize_targets and y is not None:
        y = y.index_select(-2, rows.to(y.device)).index_select(-1, cols.to(y.device))
    return x, y


class ColOut(ComposableAlgorithm, config=ColOutConfig):
    """Drops random rows and columns of training images (see `ColOutConfig`)."""

    config: ColOutConfig

    def __init__(self, config: ColOutConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    def match(self, event: Event, state: State) -> bool:
        return event == Event.BATCH_START

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        cfg = self.config
        x = get_item(state.batch, cfg.input_key, "colout")
        y = get_item(state.batch, cfg.target_key, "colout") if cfg.resize_targets else None
        x, y = colout_batch(x, y, cfg)
        state.batch = set_item(state.batch, cfg.input_key, x)
        if cfg.resize_targets:
            state.batch = set_item(state.batch, cfg.target_key, y)
