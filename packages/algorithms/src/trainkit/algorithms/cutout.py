"""Cutout (DeVries & Taylor 2017): zero out random squares of the training images.

Applied at BATCH_START, on the device; evaluation data is never touched. As Composer, one
mask serves the whole batch: ``num_holes`` squares whose centres are drawn uniformly over
the image (or, with ``uniform_sampling``, over the image grown by half a square on every
side, so that every pixel is equally likely to be covered), each spanning ``[c - L // 2,
c + L // 2)`` on both axes (the paper's code; ``L`` is the side) and clipped at the border.
``per_image=True`` draws a fresh mask for every image instead, as the paper's per-image
data transform does (same distribution per image, more varied batches; one mask per batch
is Composer's choice for speed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainkit.algorithms._batch import Key, get_item, set_item
from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary

__all__ = ["CutOut", "CutOutConfig", "cutout_batch"]


@dataclass(kw_only=True)
class CutOutConfig:
    num_holes: int = primary(1)
    """Squares per image; at least 1."""
    length: float = 0.5
    """Side of a square: a fraction of the image's shorter side if below 1 (``int(length *
    min(H, W))`` pixels, as Composer), else pixels."""
    uniform_sampling: bool = False
    """Draw centres so that every pixel is equally likely to be covered (Composer's
    option); False: centres uniform over the image, as the paper."""
    per_image: bool = False
    """A fresh mask for every image (the paper's transform); False: one mask for the batch
    (Composer)."""
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
    """A copy of the images ``x`` (N, C, H, W) with ``num_holes`` squares set to 0.

    The same squares in every image unless ``per_image``. Takes a `CutOutConfig` or its
    fields as keyword arguments.
    """
    cfg = build_config(CutOutConfig, config, options)
    if x.ndim != 4:
        raise ValueError(f"cutout needs images shaped (N, C, H, W), got shape {tuple(x.shape)}")
    n, _, height, width = x.shape
    side = int(cfg.length * min(height, width)) if cfg.length < 1 else int(cfg.length)
    masks = n if cfg.per_image else 1
    cy = _centres(height, side, (masks, cfg.num_holes, 1, 1), cfg.uniform_sampling, x.device)
    cx = _centres(width, side, (masks, cfg.num_holes, 1, 1), cfg.uniform_sampling, x.device)
    rows = torch.arange(height, device=x.device).view(1, 1, height, 1)
    cols = torch.arange(width, device=x.device).view(1, 1, 1, width)
    half = side // 2
    inside = (rows >= cy - half) & (rows < cy + half) & (cols >= cx - half) & (cols < cx + half)
    keep = ~inside.any(dim=1, keepdim=True)  # (masks, 1, H, W): the same in every channel
    return x * keep.to(x.dtype)


def _centres(
    size: int, side: int, shape: tuple[int, ...], uniform_sampling: bool, device: torch.device
) -> torch.Tensor:
    low, high = (-side // 2, size + side // 2) if uniform_sampling else (0, size)
    return torch.randint(low, high, shape, device=device)


class CutOut(ComposableAlgorithm, config=CutOutConfig):
    """Zeroes random squares of the training images (see `CutOutConfig`)."""

    config: CutOutConfig

    def __init__(self, config: CutOutConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    match_events = frozenset({Event.BATCH_START})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        cfg = self.config
        x = get_item(state.batch, cfg.input_key, "cutout")
        state.batch = set_item(state.batch, cfg.input_key, cutout_batch(x, cfg))
