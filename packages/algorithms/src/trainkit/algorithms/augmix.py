"""AugMix (Hendrycks et al. 2020): blend an image with a mix of randomly augmented copies.

For each image, ``width`` chains of ``depth`` random operations (1 to 3 when depth is -1)
are applied at ``severity``; the chains are mixed with Dirichlet(alpha) weights and the
mix is blended with the original by a Beta(alpha, alpha) weight:
``out = (1 - m) * image + m * sum_i w_i * chain_i(image)``. (The paper's Jensen-Shannon
consistency loss is not part of this method.) Implemented on tensors with torch alone;
images are float (N, C, H, W) in [0, 1], before normalisation. The Algorithm applies it at
AFTER_DATALOADER on the CPU batch; `augmix_image` can run in a Dataset transform instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from trainkit.algorithms._batch import Key, get_item, set_item
from trainkit.algorithms._image_ops import ALL_OPS, SAFE_OPS, apply_op, check_images
from trainkit.algorithms._passes import STANDARD_PASSES
from trainkit.core import Event, Logger, State

__all__ = ["AugMix", "AugMixConfig", "augmix_batch", "augmix_image"]

AugmentationSet = Literal["all", "safe"]


@dataclass(kw_only=True)
class AugMixConfig:
    severity: float = 3.0
    """Strength of every operation, from 0 to 10."""
    depth: int = -1
    """Operations per chain; -1 draws 1 to 3 per chain."""
    width: int = 3
    """Chains mixed together; at least 1."""
    alpha: float = 1.0
    """Concentration of the Dirichlet chain weights and of the Beta blend; positive."""
    augmentation_set: AugmentationSet = "safe"
    """"safe" (default: no op overlapping ImageNet-C corruptions) or "all"."""
    input_key: Key = 0
    """Where the batch keeps its images."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.severity <= 10.0:
            raise ValueError(f"severity must be in [0, 10], got {self.severity}")
        if self.depth != -1 and self.depth < 1:
            raise ValueError(f"depth must be -1 (random 1 to 3) or at least 1, got {self.depth}")
        if self.width < 1:
            raise ValueError(f"width must be at least 1, got {self.width}")
        if not self.alpha > 0:
            raise ValueError(f"alpha must be positive, got {self.alpha}")
        if self.augmentation_set not in ("all", "safe"):
            raise ValueError(
                f"augmentation_set {self.augmentation_set!r} is not one of 'all', 'safe'"
            )


def augmix_image(
    img: torch.Tensor,
    *,
    severity: float = 3.0,
    depth: int = -1,
    width: int = 3,
    alpha: float = 1.0,
    augmentation_set: AugmentationSet | Sequence[str] = "safe",
) -> torch.Tensor:
    """One image (C, H, W) in [0, 1], AugMixed. ``augmentation_set`` may list op names."""
    if isinstance(augmentation_set, str):
        AugMixConfig(
            severity=severity,
            depth=depth,
            width=width,
            alpha=alpha,
            augmentation_set=augmentation_set,
        )
        names = list(ALL_OPS if augmentation_set == "all" else SAFE_OPS)
    else:
        names = list(augmentation_set)
        unknown = sorted(set(names) - set(ALL_OPS))
        if unknown or not names:
            raise ValueError(f"unknown operations {unknown or names}; known: {sorted(ALL_OPS)}")
    weights = torch.distributions.Dirichlet(torch.full((width,), float(alpha))).sample()
    blend = float(torch.distributions.Beta(alpha, alpha).sample())
    mix = torch.zeros_like(img)
    for weight in weights.tolist():
        chain = img
        steps = depth if depth > 0 else int(torch.randint(1, 4, ()))
        for index in torch.randint(len(names), (steps,)).tolist():
            chain = apply_op(names[index], chain, severity)
        mix += weight * chain
    return torch.lerp(img, mix, blend)


def augmix_batch(
    x: torch.Tensor,
    *,
    severity: float = 3.0,
    depth: int = -1,
    width: int = 3,
    alpha: float = 1.0,
    augmentation_set: AugmentationSet = "safe",
) -> torch.Tensor:
    """Every image of ``x`` (N, C, H, W) in [0, 1], AugMixed independently."""
    check_images(x, "augmix")
    options = {"severity": severity, "depth": depth, "width": width, "alpha": alpha}
    return torch.stack(
        [augmix_image(img, augmentation_set=augmentation_set, **options) for img in x]
    )


class AugMix:
    """AugMixes every training image (see `AugMixConfig`)."""

    ordering_passes = STANDARD_PASSES

    def __init__(
        self,
        severity: float = 3.0,
        depth: int = -1,
        width: int = 3,
        alpha: float = 1.0,
        augmentation_set: AugmentationSet = "safe",
        *,
        input_key: Key = 0,
    ):
        self.config = AugMixConfig(
            severity=severity,
            depth=depth,
            width=width,
            alpha=alpha,
            augmentation_set=augmentation_set,
            input_key=input_key,
        )

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_DATALOADER

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        cfg = self.config
        x = get_item(state.batch, cfg.input_key, "augmix")
        x = augmix_batch(
            x,
            severity=cfg.severity,
            depth=cfg.depth,
            width=cfg.width,
            alpha=cfg.alpha,
            augmentation_set=cfg.augmentation_set,
        )
        state.batch = set_item(state.batch, cfg.input_key, x)
