"""Progressive resizing (fast.ai; Touvron et al. 2019): train on small images first, then full size.

Training images are shrunk by a scale that stays ``initial_scale`` until
``delay_fraction`` of training, grows linearly to 1 until ``1 - finetune_fraction``, and is
1 for the final stretch, so the model finishes at the size it is evaluated on. As in
Composer, the width is rounded to the nearest multiple of ``size_increment`` and the
height follows at the same scale, so a run sees a bounded set of image sizes (at most
``(1 - initial_scale) * width / size_increment + 1``): each new shape costs kernel
selection and allocator churn on a GPU, so the set is kept small. "resize" interpolates
with nearest neighbours (Composer's), "crop" takes one random crop for the whole batch.
Evaluation data is never touched.

Differs from Composer: it runs at BATCH_START on the device batch (Composer: at
AFTER_DATALOADER, on the CPU), and the smallest size is ``size_increment`` (never 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from trainkit.algorithms._batch import Key, get_item, set_item
from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary

__all__ = ["ProgressiveResizing", "ProgressiveResizingConfig", "resize_batch", "resizing_scale"]

Mode = Literal["resize", "crop"]


@dataclass(kw_only=True)
class ProgressiveResizingConfig:
    initial_scale: float = 0.5
    """Scale of the images at the start; in (0, 1]."""
    delay_fraction: float = 0.5
    """Fraction of training at ``initial_scale`` before growing; in [0, 1)."""
    finetune_fraction: float = 0.2
    """Final fraction of training at full size; ``delay + finetune`` at most 1."""
    size_increment: int = 4
    """Widths are rounded to a multiple of this (the height follows at the same scale), which
    bounds the number of distinct sizes in a run; positive."""
    mode: Mode = primary("resize")
    """"resize" (nearest-neighbour interpolation, as Composer) or "crop" (a random crop)."""
    resize_targets: bool = False
    """Resize or crop the targets the same way (segmentation masks, shaped (N, H, W) or
    (N, C, H, W); nearest neighbours, the dtype kept)."""
    input_key: Key = 0
    """Where the batch keeps its images, shaped (N, C, H, W)."""
    target_key: Key = 1
    """Where the batch keeps its targets."""

    def __post_init__(self) -> None:
        if not 0.0 < self.initial_scale <= 1.0:
            raise ValueError(f"initial_scale must be in (0, 1], got {self.initial_scale}")
        if not 0.0 <= self.delay_fraction < 1.0 or not 0.0 <= self.finetune_fraction <= 1.0:
            raise ValueError(
                "delay_fraction must be in [0, 1) and finetune_fraction in [0, 1], got "
                f"{self.delay_fraction} and {self.finetune_fraction}"
            )
        if self.delay_fraction + self.finetune_fraction > 1.0:
            raise ValueError(
                f"delay_fraction + finetune_fraction must be at most 1, got "
                f"{self.delay_fraction} + {self.finetune_fraction}"
            )
        if self.size_increment < 1:
            raise ValueError(f"size_increment must be positive, got {self.size_increment}")
        if self.mode not in ("resize", "crop"):
            raise ValueError(f"mode {self.mode!r} is not one of 'resize', 'crop'")


def resizing_scale(
    elapsed: float, config: ProgressiveResizingConfig | None = None, /, **options: Any
) -> float:
    """The image scale once ``elapsed`` (0 to 1) of training is done.

    Takes a `ProgressiveResizingConfig` or its fields as keyword arguments.
    """
    config = build_config(ProgressiveResizingConfig, config, options)
    grow_end = 1.0 - config.finetune_fraction
    if elapsed < config.delay_fraction:
        return config.initial_scale
    if elapsed >= grow_end:
        return 1.0
    progress = (elapsed - config.delay_fraction) / (grow_end - config.delay_fraction)
    return config.initial_scale + (1.0 - config.initial_scale) * progress


def resized_size(height: int, width: int, scale: float, size_increment: int) -> tuple[int, int]:
    """The ``(height, width)`` images of that size get at ``scale``.

    The width is rounded to the nearest multiple of ``size_increment`` (at least one
    increment, at most ``width``), and the height is scaled by the same factor (Composer's
    rule).
    """
    if scale >= 1.0:
        return height, width
    pinned = round(width * scale / size_increment) * size_increment
    pinned = min(max(pinned, min(size_increment, width)), width)
    return max(1, int(height * pinned / width)), pinned


def resize_batch(
    x: torch.Tensor,
    y: torch.Tensor | None = None,
    config: ProgressiveResizingConfig | None = None,
    /,
    *,
    scale: float,
    **options: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Images ``x`` (N, C, H, W) at ``scale`` of their size (see `resized_size`).

    ``mode``, ``size_increment`` and ``resize_targets`` come from the
    `ProgressiveResizingConfig` or keyword arguments. Returns ``(x, y)``; ``y`` changes
    only with ``resize_targets``.
    """
    cfg = build_config(ProgressiveResizingConfig, config, options)
    if x.ndim != 4:
        raise ValueError(
            f"progressive_resizing needs images shaped (N, C, H, W), got shape {tuple(x.shape)}"
        )
    height, width = x.shape[-2:]
    new_h, new_w = resized_size(height, width, scale, cfg.size_increment)
    if (new_h, new_w) == (height, width):
        return x, y
    if cfg.resize_targets and y is not None and y.ndim < 3:
        raise ValueError(
            "progressive_resizing with resize_targets needs targets shaped (N, H, W) or "
            f"(N, C, H, W), got shape {tuple(y.shape)}"
        )
    if cfg.mode == "crop":
        top = int(torch.randint(height - new_h + 1, ()))
        left = int(torch.randint(width - new_w + 1, ()))
        x = x[..., top : top + new_h, left : left + new_w]
        if cfg.resize_targets and y is not None:
            y = _crop_like(y, (height, width), (top, left, new_h, new_w))
        return x, y
    x = F.interpolate(x, size=(new_h, new_w), mode="nearest")
    if cfg.resize_targets and y is not None:
        y = _resize_targets(y, (new_h, new_w))
    return x, y


def _crop_like(y: torch.Tensor, size: tuple[int, int], box: tuple[int, int, int, int]):
    """The same region of ``y`` as ``box`` of an image of ``size``, scaled to ``y``'s size."""
    top, left, h, w = box
    ry, rx = y.shape[-2] / size[0], y.shape[-1] / size[1]
    top, left, h, w = int(top * ry), int(left * rx), int(h * ry), int(w * rx)
    return y[..., top : top + h, left : left + w]


def _resize_targets(y: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    dense = y if y.ndim == 4 else y.unsqueeze(1)
    resized = F.interpolate(dense if dense.is_floating_point() else dense.float(), size=size)
    return resized.reshape(*y.shape[:-2], *size).to(y.dtype)


class ProgressiveResizing(ComposableAlgorithm, config=ProgressiveResizingConfig):
    """Trains on smaller images early on (see `ProgressiveResizingConfig`)."""

    config: ProgressiveResizingConfig

    def __init__(self, config: ProgressiveResizingConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    match_events = frozenset({Event.BATCH_START})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        cfg = self.config
        scale = resizing_scale(state.elapsed_fraction(), cfg)
        if scale >= 1.0:
            return
        x = get_item(state.batch, cfg.input_key, "progressive_resizing")
        y = (
            get_item(state.batch, cfg.target_key, "progressive_resizing")
            if cfg.resize_targets
            else None
        )
        x, y = resize_batch(x, y, cfg, scale=scale)
        state.batch = set_item(state.batch, cfg.input_key, x)
        if cfg.resize_targets:
            state.batch = set_item(state.batch, cfg.target_key, y)
