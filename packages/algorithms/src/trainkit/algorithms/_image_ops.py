"""Image augmentation operations on tensors, for augmix and randaugment (torch only).

Each op maps one image ``(C, H, W)`` with values in [0, 1] to another, at a ``level`` in
[0, 10] (10 strongest), like the PIL operations of the AugMix and RandAugment papers.
Geometric and enhancing ops pick a random direction (torch's generator) and geometric ones
fill uncovered pixels with 0. `pil_ops` returns the same operations on PIL images.

The magnitudes, at level 10: posterize keeps 4 bits (8 at level 0), solarize inverts every
pixel (none at 0), rotate 30 degrees, shear 0.3, translate a third of the side, and the
enhancing ops (color, contrast, brightness, sharpness) blend by a factor 0.1 or 1.9 (1 at 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType

import torch
import torch.nn.functional as F

__all__ = [
    "ALL_OPS",
    "SAFE_OPS",
    "apply_op",
    "check_images",
    "enhance_factor",
    "pil_ops",
    "posterize_bits",
    "sign",
    "solarize_threshold",
]

Op = Callable[[torch.Tensor, float], torch.Tensor]


def check_images(x: torch.Tensor, method: str) -> None:
    """Raise unless ``x`` is float images (..., C, H, W) with values in [0, 1]."""
    if not x.is_floating_point() or x.ndim < 3:
        raise ValueError(
            f"{method} needs float images shaped (N, C, H, W), got {x.dtype} {tuple(x.shape)}"
        )
    if x.numel() and (x.min() < 0 or x.max() > 1):
        raise ValueError(
            f"{method} needs pixel values in [0, 1] (apply it before normalisation); got values "
            f"in [{float(x.min()):.3g}, {float(x.max()):.3g}]"
        )


def pil_ops() -> ModuleType:
    """The PIL versions of the ops (`trainkit.algorithms._pil_ops`), or an install hint."""
    try:
        from trainkit.algorithms import _pil_ops
    except ModuleNotFoundError as err:
        raise ImportError(
            f"transforms of PIL images need pillow, which is not installed ({err}); install "
            'it with: pip install "trainkit-algorithms[vision]"'
        ) from err
    return _pil_ops


def sign() -> float:
    """+1 or -1 with equal odds, from torch's generator."""
    return 1.0 if torch.rand(()) < 0.5 else -1.0


def posterize_bits(level: float) -> int:
    """Bits kept per channel: 8 at level 0, 4 at level 10."""
    return 8 - int(level * 4 / 10)


def solarize_threshold(level: float) -> int:
    """8-bit values at or above this are inverted: 256 (none) at level 0, 0 (all) at 10."""
    return 256 - int(level * 256 / 10)


def enhance_factor(level: float) -> float:
    """Blend factor of the enhancing ops: 1 +- 0.9 * level / 10, the sign drawn at random."""
    return 1.0 + 0.9 * level / 10 * sign()


def _gray(img: torch.Tensor) -> torch.Tensor:
    if img.shape[0] == 3:
        r, g, b = img
        return (0.299 * r + 0.587 * g + 0.114 * b).unsqueeze(0)
    return img.mean(0, keepdim=True)


def _blend(degenerate: torch.Tensor, img: torch.Tensor, factor: float) -> torch.Tensor:
    return (degenerate + factor * (img - degenerate)).clamp(0.0, 1.0)


def _affine(img: torch.Tensor, matrix: list[list[float]]) -> torch.Tensor:
    if matrix == [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]:
        return img  # level 0: no resampling blur
    theta = torch.tensor([matrix], dtype=img.dtype, device=img.device)
    grid = F.affine_grid(theta, [1, *img.shape], align_corners=False)
    return F.grid_sample(
        img.unsqueeze(0), grid, mode="bilinear", padding_mode="zeros", align_corners=False
    )[0].clamp(0.0, 1.0)


def autocontrast(img: torch.Tensor, level: float) -> torch.Tensor:
    low = img.amin(dim=(1, 2), keepdim=True)
    high = img.amax(dim=(1, 2), keepdim=True)
    span = high - low
    return torch.where(span > 0, (img - low) / span.clamp(min=1e-12), img)


def equalize(img: torch.Tensor, level: float) -> torch.Tensor:
    out = []
    for channel in (img * 255).round().long().clamp(0, 255):
        hist = torch.bincount(channel.flatten(), minlength=256)
        last = hist[hist.nonzero()[-1]]
        step = (hist.sum() - last) // 255
        if step == 0:
            out.append(channel.float() / 255)
            continue
        lut = ((torch.cumsum(hist, 0) - hist + step // 2) // step).clamp(0, 255)
        out.append(lut[channel].float() / 255)
    return torch.stack(out).to(img.dtype)


def posterize(img: torch.Tensor, level: float) -> torch.Tensor:
    mask = 256 - 2 ** (8 - posterize_bits(level))
    return (((img * 255).round().long() & mask).float() / 255).to(img.dtype)


def solarize(img: torch.Tensor, level: float) -> torch.Tensor:
    threshold = solarize_threshold(level) / 255
    return torch.where(img >= threshold - 1e-6, 1.0 - img, img)


def rotate(img: torch.Tensor, level: float) -> torch.Tensor:
    angle = math.radians(30.0 * level / 10 * sign())
    height, width = img.shape[-2:]
    aspect = width / height
    cos, sin = math.cos(angle), math.sin(angle)
    if angle == 0:
        return img
    return _affine(img, [[cos, -sin / aspect, 0.0], [sin * aspect, cos, 0.0]])


def shear_x(img: torch.Tensor, level: float) -> torch.Tensor:
    height, width = img.shape[-2:]  # a shear of s pixels per pixel, in normalised coordinates
    return _affine(img, [[1.0, 0.3 * level / 10 * sign() * height / width, 0.0], [0.0, 1.0, 0.0]])


def shear_y(img: torch.Tensor, level: float) -> torch.Tensor:
    height, width = img.shape[-2:]
    return _affine(img, [[1.0, 0.0, 0.0], [0.3 * level / 10 * sign() * width / height, 1.0, 0.0]])


def _shift(img: torch.Tensor, pixels: int, dim: int) -> torch.Tensor:
    out = torch.zeros_like(img)
    size = img.shape[dim]
    if abs(pixels) >= size:
        return out
    src = img.narrow(dim, max(-pixels, 0), size - abs(pixels))
    out.narrow(dim, max(pixels, 0), size - abs(pixels)).copy_(src)
    return out


def translate_x(img: torch.Tensor, level: float) -> torch.Tensor:
    return _shift(img, int(level / 10 * img.shape[-1] / 3 * sign()), -1)


def translate_y(img: torch.Tensor, level: float) -> torch.Tensor:
    return _shift(img, int(level / 10 * img.shape[-2] / 3 * sign()), -2)


def color(img: torch.Tensor, level: float) -> torch.Tensor:
    return _blend(_gray(img).expand_as(img), img, enhance_factor(level))


def contrast(img: torch.Tensor, level: float) -> torch.Tensor:
    return _blend(_gray(img).mean().expand_as(img), img, enhance_factor(level))


def brightness(img: torch.Tensor, level: float) -> torch.Tensor:
    return _blend(torch.zeros_like(img), img, enhance_factor(level))


def sharpness(img: torch.Tensor, level: float) -> torch.Tensor:
    kernel = torch.ones(3, 3, dtype=img.dtype, device=img.device)
    kernel[1, 1] = 5.0
    kernel = (kernel / 13).expand(img.shape[0], 1, 3, 3)
    smooth = img.clone()
    smooth[:, 1:-1, 1:-1] = F.conv2d(img.unsqueeze(0), kernel, groups=img.shape[0])[0]
    return _blend(smooth, img, enhance_factor(level))


SAFE_OPS: dict[str, Op] = {
    "autocontrast": autocontrast,
    "equalize": equalize,
    "posterize": posterize,
    "rotate": rotate,
    "solarize": solarize,
    "shear_x": shear_x,
    "shear_y": shear_y,
    "translate_x": translate_x,
    "translate_y": translate_y,
}
"""Ops that do not overlap the ImageNet-C corruptions (AugMix's default set)."""

ALL_OPS: dict[str, Op] = {
    **SAFE_OPS,
    "color": color,
    "contrast": contrast,
    "brightness": brightness,
    "sharpness": sharpness,
}


def apply_op(name: str, img: torch.Tensor, level: float) -> torch.Tensor:
    """``ALL_OPS[name](img, level)``."""
    return ALL_OPS[name](img, level)
