"""Cutout (DeVries & Taylor 2017): zero out random squares of each training image.

Applied at BATCH_START, on the device, with a fresh mask per sample; evaluation data is
never touched. A square whose centre lies near the border is clipped by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainkit.algorithms._batch import Key, get_item, set_item
from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config

__all__ = ["CutOut", "CutOutConfig", "cutout_batch"]


@dataclass(kw_only=True)
class CutOutConfig:
    num_holes: int = 1
    """Squares per image; at least 1."""
    length: float = 0.5
    """Side of a square: a fraction of the image's shorter side if below 1, else pixels."""
    input_key: Key = 0
    """Where the batch keeps its images, shaped (N, C, H, W)."""

    def __post_init__(self) -> None:
        if (
            isinstance(self.num_holes, bool)
            or not isinstance(self.num_holes, int)
            or self.num_holes < 1
        ):
            raise ValueError(f"num_holes must be an int of at least 1, got {self.num_holes!r}")
        if not self.length > 0 or (self.length >= 1 and not float(self.length).is_integer()):
            raise ValueError(
                f"length must be a fraction in (0, 1) of the shorter side or a whole number of "
                f"pixels, got {self.length}"
            )


def cutout_batch(
    x: torch.Tensor, config: CutOutConfig | None = None, /, **options: Any
) -> torch.Tensor:
    """A copy of the images ``x`` (N, C, H, W) with ``num_holes`` squares per image set to 0.

    Takes a `CutOutConfig` or its fields as keyword arguments.
    """
    cfg = build_config(CutOutConfig, config, options)
    num_holes, length = cfg.num_holes, cfg.length
    if x.ndim != 4:
        raise ValueError(f"cutout needs images shaped (N, C, H, W), got shape {tuple(x.shape)}")
    n, _, height, width = x.shape
    side = round(length * min(height, width)) if length < 1 else int(length)
    rows = torch.arange(height, device=x.device).view(1, 1, height, 1)
    cols = torch.arange(width, device=x.device).view(1, 1, 1, width)
    cy = torch.randint(height, (n, num_holes, 1, 1), device=x.device)
    cx = torch.randint(width, (n, num_holes, 1, 1), device=x.device)
    top, left = cy - side // 2, cx - side // 2
    inside = (rows >= top) & (rows < top + side) & (cols >= left) & (cols < left + side)
    keep = ~inside.any(dim=1, keepdim=True)  # (N, 1, H, W): the same holes in every channel
    return x * keep.to(x.dtype)


class CutOut(ComposableAlgorithm, config=CutOutConfig):
    """Zeroes random squares of each training image (see `CutOutConfig`)."""

    config: CutOutConfig

    def __init__(self, config: CutOutConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    def match(self, event: Event, state: State) -> bool:
        return event == Event.BATCH_START

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        cfg = self.config
        x = get_item(state.batch, cfg.input_key, "cutout")
        state.batch = set_item(state.batch, cfg.input_key, cutout_batch(x, cfg))
