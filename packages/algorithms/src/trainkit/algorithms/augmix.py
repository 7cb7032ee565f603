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

from dataclasses import dataclass
from typing import Any, Literal

import torch

from trainkit.algorithms._batch import Key, get_item, set_item
from trainkit.algorithms._image_ops import ALL_OPS, SAFE_OPS, apply_op, check_images
from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config

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
    augmentation_set: AugmentationSet | list[str] = "safe"
    """"safe" (default: no op overlapping ImageNet-C corruptions), "all", or a list of
    operation names (e.g. ["solarize", "rotate"])."""
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
        if isinstance(self.augmentation_set, str):
            if self.augmentation_set not in ("all", "safe"):
                raise ValueError(
                    f"augmentation_set {self.augmentation_set!r} is not one of 'all', 'safe'"
                )
        else:
            names = list(self.augmentation_set)
            unknown = sorted(set(names) - set(ALL_OPS))
            if unknown or not names:
                raise ValueError(f"unknown operations {unknown or names}; known: {sorted(ALL_OPS)}")

    def operations(self) -> list[str]:
        """The names of the operations chains draw from."""
        if isinstance(self.augmentation_set, str):
            return list(ALL_OPS if self.augmentation_set == "all" else SAFE_OPS)
        return list(self.augmentation_set)


def augmix_image(
    img: torch.Tensor, config: AugMixConfig | None = None, /, **options: Any
) -> torch.Tensor:
    """One image (C, H, W) in [0, 1], AugMixed.

    Takes an `AugMixConfig` or its fields as keyword arguments.
    """
    cfg = build_config(AugMixConfig, config, options)
    names = cfg.operations()
    weights = torch.distributions.Dirichlet(torch.full((cfg.width,), float(cfg.alpha))).sample()
    blend = float(torch.distributions.Beta(cfg.alpha, cfg.alpha).sample())
    mix = torch.zeros_like(img)
    for weight in weights.tolist():
        chain = img
        steps = cfg.depth if cfg.depth > 0 else int(torch.randint(1, 4, ()))
        for index in torch.randint(len(names), (steps,)).tolist():
            chain = apply_op(names[index], chain, cfg.severity)
        mix += weight * chain
    return torch.lerp(img, mix, blend)


def augmix_batch(
    x: torch.Tensor, config: AugMixConfig | None = None, /, **options: Any
) -> torch.Tensor:
    """Every image of ``x`` (N, C, H, W) in [0, 1], AugMixed independently.

    Takes an `AugMixConfig` or its fields as keyword arguments.
    """
    cfg = build_config(AugMixConfig, config, options)
    check_images(x, "augmix")
    return torch.stack([augmix_image(img, cfg) for img in x])


class AugMix(ComposableAlgorithm, config=AugMixConfig):
    """AugMixes every training image (see `AugMixConfig`)."""

    config: AugMixConfig

    def __init__(self, config: AugMixConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    def match(self, event: Event, state: State) -> bool:
        return event == Event.AFTER_DATALOADER

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        cfg = self.config
        x = get_item(state.batch, cfg.input_key, "augmix")
        state.batch = set_item(state.batch, cfg.input_key, augmix_batch(x, cfg))
