"""RandAugment (Cubuk et al. 2020): ``num_ops`` random image operations at one magnitude.

Each training image gets its own ``num_ops`` operations, drawn uniformly from the set
(autocontrast, equalize, posterize, rotate, solarize, shear, translate, and with "all"
also color, contrast, brightness, sharpness), applied at ``magnitude`` (0 to 10).
Implemented on tensors with torch alone; images are float (N, C, H, W) in [0, 1], before
normalisation. The Algorithm applies it at AFTER_DATALOADER, on the CPU batch; use
`randaugment_image` in a Dataset transform to run it in the loader's workers instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from trainkit.algorithms._batch import Key, get_item, set_item
from trainkit.algorithms._image_ops import ALL_OPS, SAFE_OPS, apply_op, check_images
from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config

__all__ = ["RandAugment", "RandAugmentConfig", "randaugment_batch", "randaugment_image"]

AugmentationSet = Literal["all", "safe"]


@dataclass(kw_only=True)
class RandAugmentConfig:
    num_ops: int = 2
    """Operations applied to each image, one after another; at least 1."""
    magnitude: float = 9.0
    """Strength of every operation, from 0 to 10."""
    augmentation_set: AugmentationSet = "all"
    """"all" operations, or "safe" (without color, contrast, brightness, sharpness)."""
    input_key: Key = 0
    """Where the batch keeps its images."""

    def __post_init__(self) -> None:
        if isinstance(self.num_ops, bool) or not isinstance(self.num_ops, int) or self.num_ops < 1:
            raise ValueError(f"num_ops must be an int of at least 1, got {self.num_ops!r}")
        if not 0.0 <= self.magnitude <= 10.0:
            raise ValueError(f"magnitude must be in [0, 10], got {self.magnitude}")
        if self.augmentation_set not in ("all", "safe"):
            raise ValueError(
                f"augmentation_set {self.augmentation_set!r} is not one of 'all', 'safe'"
            )


def randaugment_image(
    img: torch.Tensor, config: RandAugmentConfig | None = None, /, **options: Any
) -> torch.Tensor:
    """One image (C, H, W) in [0, 1] after ``num_ops`` random operations.

    Takes a `RandAugmentConfig` or its fields as keyword arguments.
    """
    cfg = build_config(RandAugmentConfig, config, options)
    names = list(ALL_OPS if cfg.augmentation_set == "all" else SAFE_OPS)
    for index in torch.randint(len(names), (cfg.num_ops,)).tolist():
        img = apply_op(names[index], img, cfg.magnitude)
    return img


def randaugment_batch(
    x: torch.Tensor, config: RandAugmentConfig | None = None, /, **options: Any
) -> torch.Tensor:
    """Every image of ``x`` (N, C, H, W) in [0, 1] with its own random operations.

    Takes a `RandAugmentConfig` or its fields as keyword arguments.
    """
    cfg = build_config(RandAugmentConfig, config, options)
    check_images(x, "randaugment")
    return torch.stack([randaugment_image(img, cfg) for img in x])


class RandAugment(ComposableAlgorithm, config=RandAugmentConfig):
    """Applies random image operations to every training image (see `RandAugmentConfig`)."""

    config: RandAugmentConfig

    def __init__(self, config: RandAugmentConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_DATALOADER

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        cfg = self.config
        x = get_item(state.batch, cfg.input_key, "randaugment")
        state.batch = set_item(state.batch, cfg.input_key, randaugment_batch(x, cfg))
