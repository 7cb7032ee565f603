"""CutMix (Yun et al. 2019): paste a box from another sample and mix the targets by area.

At BEFORE_FORWARD each microbatch gets one box, the same for every sample (as Composer),
filled from ``x[perm]``. The box is drawn as in the paper's code: ``lam ~ Beta(alpha,
alpha)``, sides ``int(H * sqrt(1 - lam))`` and ``int(W * sqrt(1 - lam))``, centre uniform
over the image (or, with ``uniform_sampling``, over the image grown by half a box on every
side, so that every pixel is equally likely to be covered), clipped at the border. The
targets mix by the share of the area actually pasted, ``mixing``:

- ``interpolate_loss=False`` (default, as Composer): at BEFORE_LOSS the targets become
  ``(1 - mixing) * one_hot(y) + mixing * one_hot(y[perm])`` (the model's loss must accept
  probabilities, as ``F.cross_entropy`` does); targets with the images' height and width
  (segmentation masks) get the same box pasted from ``y[perm]`` instead. The original
  targets are put back at AFTER_LOSS.
- ``interpolate_loss=True``: at AFTER_LOSS the loss becomes ``(1 - mixing) * loss(y) +
  mixing * loss(y[perm])`` with the model's own loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainkit.algorithms._batch import Key, get_item, interpolate_loss, set_item
from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.algorithms._targets import mix_probabilities
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary

__all__ = ["CutMix", "CutMixConfig", "cutmix_batch", "random_box"]

Box = tuple[int, int, int, int]
"""``(top, left, height, width)`` in pixels."""


@dataclass(kw_only=True)
class CutMixConfig:
    alpha: float = primary(1.0)
    """The box's nominal share of the area, ``1 - lam``, has ``lam ~ Beta(alpha, alpha)``;
    positive."""
    interpolate_loss: bool = False
    """False: mix the targets (as one-hot probabilities, or paste the box into masks);
    True: mix the two losses."""
    uniform_sampling: bool = False
    """Draw the box centre so that every pixel is equally likely to be covered (Composer's
    option); False: centre uniform over the image, as the paper."""
    input_key: Key = 0
    """Where the batch keeps its images, shaped (N, C, H, W) (or (N, C, ...spatial))."""
    target_key: Key = 1
    """Where the batch keeps its targets."""

    def __post_init__(self) -> None:
        if not self.alpha > 0:
            raise ValueError(f"alpha must be positive, got {self.alpha}")


def _centre(size: int, cut: int, uniform_sampling: bool) -> int:
    if uniform_sampling:
        low = -cut // 2
        return low + int(torch.randint(size + cut // 2 - low, ()))
    return int(torch.randint(size, ()))


def random_box(height: int, width: int, area: float, *, uniform_sampling: bool = False) -> Box:
    """A box of sides ``int(side * sqrt(area))``, centred at random, clipped at the border.

    It spans ``[centre - cut // 2, centre + cut // 2)`` on each axis (the paper's code).
    """
    cut_h, cut_w = int(height * area**0.5), int(width * area**0.5)
    cy = _centre(height, cut_h, uniform_sampling)
    cx = _centre(width, cut_w, uniform_sampling)
    top, bottom = min(max(cy - cut_h // 2, 0), height), min(max(cy + cut_h // 2, 0), height)
    left, right = min(max(cx - cut_w // 2, 0), width), min(max(cx + cut_w // 2, 0), width)
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
    area; train on the targets ``(1 - mixing) * y + mixing * y_permuted``. The box is
    drawn (see `random_box`, with ``alpha`` and ``uniform_sampling`` from the
    `CutMixConfig` or keyword arguments) and ``indices`` is a random permutation, unless
    given.
    """
    cfg = build_config(CutMixConfig, config, options)
    if x.ndim < 3:
        raise ValueError(f"cutmix needs images shaped (N, C, H, W), got shape {tuple(x.shape)}")
    height, width = x.shape[-2:]
    if box is None:
        lam = float(torch.distributions.Beta(cfg.alpha, cfg.alpha).sample())
        box = random_box(height, width, 1.0 - lam, uniform_sampling=cfg.uniform_sampling)
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
        self._original: Any = None
        self._image_size: tuple[int, int] = (0, 0)

    match_events = frozenset({Event.BEFORE_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS})

    def match(self, event: Event, state: State) -> bool:
        if event == Event.BEFORE_FORWARD:
            return True
        if self.config.interpolate_loss:
            return event == Event.AFTER_LOSS
        return event in (Event.BEFORE_LOSS, Event.AFTER_LOSS)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        cfg = self.config
        if event == Event.BEFORE_FORWARD:
            x = get_item(state.batch, cfg.input_key, "cutmix")
            y = get_item(state.batch, cfg.target_key, "cutmix")
            if x.ndim < 3:
                raise ValueError(
                    f"cutmix needs images shaped (N, C, H, W), got shape {tuple(x.shape)}"
                )
            self._image_size = (x.shape[-2], x.shape[-1])
            lam = float(torch.distributions.Beta(cfg.alpha, cfg.alpha).sample())
            self.box = random_box(
                *self._image_size, 1.0 - lam, uniform_sampling=cfg.uniform_sampling
            )
            self.indices = torch.randperm(x.shape[0], device=x.device)
            x_cut, self.permuted_targets, self.mixing = cutmix_batch(
                x, y, cfg, box=self.box, indices=self.indices
            )
            state.batch = set_item(state.batch, cfg.input_key, x_cut)
        elif cfg.interpolate_loss:
            if self._is_mask(self.permuted_targets):
                raise ValueError(
                    "cutmix cannot interpolate the loss for targets shaped like the images "
                    "(masks); use interpolate_loss=False, which pastes the box into them"
                )
            interpolate_loss(state, cfg.target_key, self.permuted_targets, self.mixing)
        elif event == Event.BEFORE_LOSS:
            self._original = get_item(state.batch, cfg.target_key, "cutmix")
            state.batch = set_item(state.batch, cfg.target_key, self._mixed_targets(state))
        elif self._original is not None:
            state.batch = set_item(state.batch, cfg.target_key, self._original)
            self._original = None

    def _is_mask(self, target: Any) -> bool:
        return (
            isinstance(target, torch.Tensor)
            and target.ndim > 2
            and (tuple(target.shape[-2:]) == self._image_size)
        )

    def _mixed_targets(self, state: State) -> torch.Tensor:
        if self._is_mask(self.permuted_targets):
            assert self.box is not None
            top, left, box_h, box_w = self.box
            mixed = self._original.clone()
            region = (..., slice(top, top + box_h), slice(left, left + box_w))
            mixed[region] = self.permuted_targets[region]
            return mixed
        return mix_probabilities(
            state.outputs, self._original, self.permuted_targets, self.mixing, "cutmix"
        )
