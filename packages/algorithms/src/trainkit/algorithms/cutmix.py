"""CutMix (Yun et al. 2019): paste a box from another sample and mix the targets by area.

At BEFORE_FORWARD each microbatch gets one box (of a Beta(alpha, alpha) share of the
image area, at a random place, clipped at the border) filled from ``x[perm]``; at
AFTER_LOSS the loss becomes ``(1 - mixing) * loss(y) + mixing * loss(y[perm])`` where
``mixing`` is the area actually pasted, with the model's own loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from trainkit.algorithms._batch import Key, get_item, interpolate_loss, set_item
from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config

__all__ = ["CutMix", "CutMixConfig", "cutmix_batch"]

Box = tuple[int, int, int, int]
"""``(top, left, height, width)`` in pixels."""


@dataclass(kw_only=True)
class CutMixConfig:
    alpha: float = 1.0
    """The pasted share of the area is drawn from Beta(alpha, alpha); positive."""
    input_key: Key = 0
    """Where the batch keeps its images, shaped (N, C, H, W) (or (N, C, ...spatial))."""
    target_key: Key = 1
    """Where the batch keeps its targets."""

    def __post_init__(self) -> None:
        if not self.alpha > 0:
            raise ValueError(f"alpha must be positive, got {self.alpha}")


def random_box(height: int, width: int, area: float) -> Box:
    """A box covering about ``area`` of the image, centred at random, clipped at the border."""
    cut_h, cut_w = round(height * math.sqrt(area)), round(width * math.sqrt(area))
    cy, cx = (int(torch.randint(n, ())) for n in (height, width))
    top, bottom = max(cy - cut_h // 2, 0), min(cy + (cut_h + 1) // 2, height)
    left, right = max(cx - cut_w // 2, 0), min(cx + (cut_w + 1) // 2, width)
    return top, left, bottom - top, right - left


def cutmix_batch(
    x: torch.Tensor,
    y: torch.Tensor,
    config: CutMixConfig | None = None,
    /,
    *,
    box: Box | None = None,
    indices: torch.Tensor | None = None,
    **options: Any,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Paste ``box`` of ``x[indices]`` into ``x`` (a copy).

    Returns ``(x_cut, y_permuted, mixing)``: ``mixing`` is the pasted share of the image
    area; train on ``(1 - mixing) * loss(y) + mixing * loss(y_permuted)``. The box is
    drawn (see `random_box`, with ``alpha`` from the `CutMixConfig` or keyword arguments)
    and ``indices`` is a random permutation unless given.
    """
    alpha = build_config(CutMixConfig, config, options).alpha
    if x.ndim < 3:
        raise ValueError(f"cutmix needs images shaped (N, C, H, W), got shape {tuple(x.shape)}")
    height, width = x.shape[-2:]
    if box is None:
        box = random_box(height, width, float(torch.distributions.Beta(alpha, alpha).sample()))
    top, left, box_h, box_w = box
    if (
        top < 0
        or left < 0
        or box_h < 0
        or box_w < 0
        or top + box_h > height
        or left + box_w > width
    ):
        raise ValueError(f"box {box} does not fit in a {height}x{width} image")
    if indices is None:
        indices = torch.randperm(x.shape[0], device=x.device)
    x_cut = x.clone()
    region = (..., slice(top, top + box_h), slice(left, left + box_w))
    x_cut[region] = x[indices][region]
    return x_cut, y[indices], box_h * box_w / (height * width)


class CutMix(ComposableAlgorithm, config=CutMixConfig):
    """Trains on images with a box pasted from another sample (see `CutMixConfig`)."""

    config: CutMixConfig
    mixes_targets = True

    def __init__(self, config: CutMixConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self.mixing = 0.0
        self.box: Box | None = None
        self.indices: torch.Tensor | None = None
        self.permuted_targets: Any = None

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.BEFORE_FORWARD, Event.AFTER_LOSS)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        cfg = self.config
        if event == Event.BEFORE_FORWARD:
            x = get_item(state.batch, cfg.input_key, "cutmix")
            y = get_item(state.batch, cfg.target_key, "cutmix")
            if x.ndim < 3:
                raise ValueError(
                    f"cutmix needs images shaped (N, C, H, W), got shape {tuple(x.shape)}"
                )
            area = float(torch.distributions.Beta(cfg.alpha, cfg.alpha).sample())
            self.box = random_box(x.shape[-2], x.shape[-1], area)
            self.indices = torch.randperm(x.shape[0], device=x.device)
            x_cut, self.permuted_targets, self.mixing = cutmix_batch(
                x, y, cfg, box=self.box, indices=self.indices
            )
            state.batch = set_item(state.batch, cfg.input_key, x_cut)
            return
        interpolate_loss(state, cfg.target_key, self.permuted_targets, self.mixing)
