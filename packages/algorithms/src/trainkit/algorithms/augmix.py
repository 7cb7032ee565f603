"""AugMix (Hendrycks et al. 2020): blend an image with a mix of randomly augmented copies.

For each image, ``width`` chains of ``depth`` random operations (1 to 3 when depth is -1)
are applied; the chains are mixed with Dirichlet(alpha) weights and the mix is blended
with the original by a Beta(alpha, alpha) weight:
``out = (1 - m) * image + m * sum_i w_i * chain_i(image)``. As in the paper's code (and
Composer), each operation's strength is drawn uniformly from [0.1, ``severity``]. (The
paper's Jensen-Shannon consistency loss is not part of this method.)

Three forms, one config: `AugmentAndMixTransform`, a dataset transform on PIL images (as
Composer's; tensors (C, H, W) in [0, 1] too); the `AugMix` algorithm with ``batch=False``,
which puts that transform into the training dataset at FIT_START (a torchvision dataset);
and with ``batch=True`` (the default), every image of the CPU batch at AFTER_DATALOADER
(float (N, C, H, W) in [0, 1], before normalisation).

Differs from Composer: the default operations are the paper's "safe" set (Composer:
"all"); the enhancing ops span factors 0.1 to 1.9 as in RandAugment; the mix is rounded
to 8 bits rather than truncated; the algorithm augments batches by default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch

from trainkit.algorithms._batch import Key, get_item, set_item
from trainkit.algorithms._image_ops import ALL_OPS, SAFE_OPS, apply_op, check_images, pil_ops
from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.algorithms._vision import add_dataset_transform
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary

__all__ = [
    "AugMix",
    "AugMixConfig",
    "AugmentAndMixTransform",
    "augmix_batch",
    "augmix_image",
    "sample_level",
]

AugmentationSet = Literal["all", "safe"]
Image = TypeVar("Image")


@dataclass(kw_only=True)
class AugMixConfig:
    severity: float = primary(3.0)
    """Largest strength of an operation, from 0 to 10; each draws its own from [0.1, severity]."""
    depth: int = -1
    """Operations per chain; -1 draws 1 to 3 per chain."""
    width: int = 3
    """Chains mixed together; at least 1."""
    alpha: float = 1.0
    """Concentration of the Dirichlet chain weights and of the Beta blend; positive."""
    augmentation_set: AugmentationSet | list[str] = "safe"
    """"safe" (default: no op overlapping ImageNet-C corruptions), "all", or a list of
    operation names (e.g. ["solarize", "rotate"])."""
    batch: bool = True
    """True: augment each batch at AFTER_DATALOADER. False: put an `AugmentAndMixTransform`
    into the training dataset's transforms at FIT_START (needs torchvision)."""
    input_key: Key = 0
    """Where the batch keeps its images (``batch=True``)."""

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


def sample_level(severity: float) -> float:
    """An operation's strength: uniform in [0.1, severity] (``severity`` itself below 0.1)."""
    if severity <= 0.1:
        return severity
    return 0.1 + (severity - 0.1) * float(torch.rand(()))


def _mix(
    img: Any,
    cfg: AugMixConfig,
    apply: Callable[[str, Any, float], Any],
    as_float: Callable[[Any], torch.Tensor],
) -> torch.Tensor:
    """``(1 - m) * img + m * sum_i w_i * chain_i(img)``, as a float tensor."""
    names = cfg.operations()
    weights = torch.distributions.Dirichlet(torch.full((cfg.width,), float(cfg.alpha))).sample()
    blend = float(torch.distributions.Beta(cfg.alpha, cfg.alpha).sample())
    original = as_float(img)
    mix = torch.zeros_like(original)
    for weight in weights.tolist():
        chain = img
        steps = cfg.depth if cfg.depth > 0 else int(torch.randint(1, 4, ()))
        for index in torch.randint(len(names), (steps,)).tolist():
            chain = apply(names[index], chain, sample_level(cfg.severity))
        mix += weight * as_float(chain)
    return torch.lerp(original, mix, blend)


def augmix_image(img: Image, config: AugMixConfig | None = None, /, **options: Any) -> Image:
    """One image, AugMixed: a tensor (C, H, W) in [0, 1] or an RGB / grayscale PIL image
    (needs pillow), returned as the same kind.

    Takes an `AugMixConfig` or its fields as keyword arguments.
    """
    cfg = build_config(AugMixConfig, config, options)
    if isinstance(img, torch.Tensor):
        return _mix(img, cfg, apply_op, lambda t: t)  # type: ignore[return-value]
    ops = pil_ops()
    ops.check_pil_image(img, "augmix")
    mixed = _mix(img, cfg, ops.apply_pil_op, lambda i: ops.to_tensor(i).float())
    return ops.from_tensor(mixed.round().clamp(0, 255).to(torch.uint8), img.mode)  # type: ignore[attr-defined]


def augmix_batch(
    x: torch.Tensor, config: AugMixConfig | None = None, /, **options: Any
) -> torch.Tensor:
    """Every image of ``x`` (N, C, H, W) in [0, 1], AugMixed independently.

    Takes an `AugMixConfig` or its fields as keyword arguments.
    """
    cfg = build_config(AugMixConfig, config, options)
    check_images(x, "augmix")
    return torch.stack([augmix_image(img, cfg) for img in x])


class AugmentAndMixTransform:
    """A dataset transform: `augmix_image` on each PIL image (or (C, H, W) tensor).

    Takes an `AugMixConfig` or its fields as keyword arguments; ``batch`` and ``input_key``
    do not apply to it.
    """

    def __init__(self, config: AugMixConfig | None = None, /, **options: Any) -> None:
        self.config = build_config(AugMixConfig, config, options)

    def __call__(self, img: Image) -> Image:
        if isinstance(img, torch.Tensor):
            check_images(img, "AugmentAndMixTransform")
        return augmix_image(img, self.config)

    def __repr__(self) -> str:
        cfg = self.config
        return (
            f"AugmentAndMixTransform(severity={cfg.severity}, depth={cfg.depth}, "
            f"width={cfg.width}, alpha={cfg.alpha}, augmentation_set={cfg.augmentation_set!r})"
        )


class AugMix(ComposableAlgorithm, config=AugMixConfig):
    """AugMixes every training image (see `AugMixConfig`)."""

    config: AugMixConfig

    def __init__(self, config: AugMixConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._transform = AugmentAndMixTransform(self.config)

    @property
    def match_events(self) -> frozenset[Event]:  # type: ignore[override]
        return frozenset({Event.AFTER_DATALOADER if self.config.batch else Event.FIT_START})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        cfg = self.config
        if not cfg.batch:
            add_dataset_transform(state, self._transform, "augmix")
            return
        x = get_item(state.batch, cfg.input_key, "augmix")
        state.batch = set_item(state.batch, cfg.input_key, augmix_batch(x, cfg))
