"""RandAugment (Cubuk et al. 2020): ``num_ops`` random image operations at one magnitude.

Each training image gets its own ``num_ops`` operations, drawn uniformly from the set
(autocontrast, equalize, posterize, rotate, solarize, shear, translate, and with "all"
also color, contrast, brightness, sharpness), applied at ``magnitude`` (0 to 10).

Three forms, one config:

- `RandAugmentTransform`, a dataset transform (PIL images, as Composer's
  ``RandAugmentTransform``; tensors ``(C, H, W)`` in [0, 1] too), run in the loader's
  workers: put it in your dataset's transforms before ``ToTensor``;
- the `RandAugment` algorithm with ``batch=False`` puts that transform into the training
  dataset at FIT_START (a torchvision dataset; as Composer's algorithm does);
- with ``batch=True`` (the default) it augments each image of the CPU batch at
  AFTER_DATALOADER (float (N, C, H, W) in [0, 1], before normalisation), for loaders of
  tensors.

Differs from Composer: every operation runs at exactly ``magnitude``, as in the paper
(Composer draws each operation's strength uniformly up to it, as AugMix does); the
enhancing ops span factors 0.1 to 1.9 as in the paper; the algorithm augments batches by
default (Composer: only as a dataset transform).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch

from trainkit.algorithms._batch import Key, get_item, set_item
from trainkit.algorithms._image_ops import ALL_OPS, SAFE_OPS, apply_op, check_images, pil_ops
from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.algorithms._vision import add_dataset_transform
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config

__all__ = [
    "RandAugment",
    "RandAugmentConfig",
    "RandAugmentTransform",
    "randaugment_batch",
    "randaugment_image",
]

AugmentationSet = Literal["all", "safe"]
Image = TypeVar("Image")


@dataclass(kw_only=True)
class RandAugmentConfig:
    num_ops: int = 2
    """Operations applied to each image, one after another; at least 1 (N in the paper)."""
    magnitude: float = 9.0
    """Strength of every operation, from 0 to 10 (M in the paper)."""
    augmentation_set: AugmentationSet = "all"
    """"all" operations, or "safe" (without color, contrast, brightness, sharpness)."""
    batch: bool = True
    """True: augment each batch at AFTER_DATALOADER. False: put a `RandAugmentTransform` into
    the training dataset's transforms at FIT_START (needs torchvision)."""
    input_key: Key = 0
    """Where the batch keeps its images (``batch=True``)."""

    def __post_init__(self) -> None:
        if isinstance(self.num_ops, bool) or not isinstance(self.num_ops, int) or self.num_ops < 1:
            raise ValueError(f"num_ops must be an int of at least 1, got {self.num_ops!r}")
        if not 0.0 <= self.magnitude <= 10.0:
            raise ValueError(f"magnitude must be in [0, 10], got {self.magnitude}")
        if self.augmentation_set not in ("all", "safe"):
            raise ValueError(
                f"augmentation_set {self.augmentation_set!r} is not one of 'all', 'safe'"
            )

    def operations(self) -> list[str]:
        """The names of the operations drawn from."""
        return list(ALL_OPS if self.augmentation_set == "all" else SAFE_OPS)


def randaugment_image(
    img: Image, config: RandAugmentConfig | None = None, /, **options: Any
) -> Image:
    """One image after ``num_ops`` random operations: a tensor (C, H, W) in [0, 1] or an
    RGB / grayscale PIL image (needs pillow), returned as the same kind.

    Takes a `RandAugmentConfig` or its fields as keyword arguments.
    """
    cfg = build_config(RandAugmentConfig, config, options)
    names = cfg.operations()
    if isinstance(img, torch.Tensor):
        apply = apply_op
    else:
        ops = pil_ops()
        ops.check_pil_image(img, "randaugment")
        apply = ops.apply_pil_op
    for index in torch.randint(len(names), (cfg.num_ops,)).tolist():
        img = apply(names[index], img, cfg.magnitude)
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


class RandAugmentTransform:
    """A dataset transform: `randaugment_image` on each PIL image (or (C, H, W) tensor).

    Takes a `RandAugmentConfig` or its fields as keyword arguments; ``batch`` and
    ``input_key`` do not apply to it.
    """

    def __init__(self, config: RandAugmentConfig | None = None, /, **options: Any) -> None:
        self.config = build_config(RandAugmentConfig, config, options)

    def __call__(self, img: Image) -> Image:
        if isinstance(img, torch.Tensor):
            check_images(img, "RandAugmentTransform")
        return randaugment_image(img, self.config)

    def __repr__(self) -> str:
        cfg = self.config
        return (
            f"RandAugmentTransform(num_ops={cfg.num_ops}, magnitude={cfg.magnitude}, "
            f"augmentation_set={cfg.augmentation_set!r})"
        )


class RandAugment(ComposableAlgorithm, config=RandAugmentConfig):
    """Applies random image operations to every training image (see `RandAugmentConfig`)."""

    config: RandAugmentConfig

    def __init__(self, config: RandAugmentConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._transform = RandAugmentTransform(self.config)

    @property
    def match_events(self) -> frozenset[Event]:  # type: ignore[override]
        return frozenset({Event.AFTER_DATALOADER if self.config.batch else Event.FIT_START})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        cfg = self.config
        if not cfg.batch:
            add_dataset_transform(state, self._transform, "randaugment")
            return
        x = get_item(state.batch, cfg.input_key, "randaugment")
        state.batch = set_item(state.batch, cfg.input_key, randaugment_batch(x, cfg))
