"""Image augmentation operations on tensors, for augmix and randaugment (torch only).

Each op maps one image ``(C, H, W)`` with values in [0, 1] to another, at a ``level`` in
[0, 10] (10 strongest), like the PIL operations of the AugMix and RandAugment papers.
Geometric ops pick a random direction and fill uncovered pixels with 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

__all__ = ["ALL_OPS", "SAFE_OPS", "apply_op", "check_images"]

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


def _sign() -> float:
    return 1.0 if torch.rand(()) < 0.5 else -1.0


def _gray(img: torch.Tensor) -> torch.Tensor:
    if img.shape[0] == 3:
        r, g, b = img
        return (0.299 * r + 0.587 * g + 0.114 * b).unsqueeze(0)
    return img.mean(0, keepdim=True)


def _blend(degenerate: torch.Tensor, img: torch.Tensor, factor: float) -> torch.Tensor:
    return (degenerate + factor * (img - degenerate)).clamp(0.0, 1.0)


def _affine(img: torch.Tensor, matrix: list[list[float]]) -> torch.Tensor:
    theta = torch.tensor([matrix], dtype=img.dtype, device=img.device)
    grid = F.affine_grid(theta, [1, *img.shape], align_corners=False)
    return F.grid_sample(
        img.unsqueeze(0), grid, mode="nearest", padding_mode="zeros", align_corners=False
    )[0]


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
    bits = 8 - int(level * 4 / 10)
    mask = 256 - 2 ** (8 - bits)
    return (((img * 255).round().long() & mask).float() / 255).to(img.dtype)


def solarize(img: torch.Tensor, level: float) -> torch.Tensor:
    threshold = 1.0 - level / 10
    return torch.where(img >= threshold, 1.0 - img, img)


def rotate(img: torch.Tensor, level: float) -> torch.Tensor:
    angle = math.radians(30.0 * level / 10 * _sign())
    height, width = img.shape[-2:]
    aspect = width / height
    cos, sin = math.cos(angle), math.sin(angle)
    return _affine(img, [[cos, -sin / aspect, 0.0], [sin * aspect, cos, 0.0]])


def shear_x(img: torch.Tensor, level: float) -> torch.Tensor:
    return _affine(img, [[1.0, 0.3 * level / 10 * _sign(), 0.0], [0.0, 1.0, 0.0]])


def shear_y(img: torch.Tensor, level: float) -> torch.Tensor:
    return _affine(img, [[1.0, 0.0, 0.0], [0.3 * level / 10 * _sign(), 1.0, 0.0]])


def _shift(img: torch.Tensor, pixels: int, dim: int) -> torch.Tensor:
    out = torch.zeros_like(img)
    size = img.shape[dim]
    if abs(pixels) >= size:
        return out
    src = img.narrow(dim, max(-pixels, 0), size - abs(pixels))
    out.narrow(dim, max(pixels, 0), size - abs(pixels)).copy_(src)
    return out


def translate_x(img: torch.Tensor, level: float) -> torch.Tensor:
    return _shift(img, int(level / 10 * img.shape[-1] / 3 * _sign()), -1)


def translate_y(img: torch.Tensor, level: float) -> torch.Tensor:
    return _shift(img, int(level / 10 * img.shape[-2] / 3 * _sign()), -2)


def _factor(level: float) -> float:
    return 1.0 + 0.9 * level / 10 * _sign()  # 0.1 to 1.9


def color(img: torch.Tensor, level: float) -> torch.Tensor:
    return _blend(_gray(img).expand_as(img), img, _factor(level))


def contrast(img: torch.Tensor, level: float) -> torch.Tensor:
    return _blend(_gray(img).mean().expand_as(img), img, _factor(level))


def brightness(img: torch.Tensor, level: float) -> torch.Tensor:
    return _blend(torch.zeros_like(img), img, _factor(level))


def sharpness(img: torch.Tensor, level: float) -> torch.Tensor:
    kernel = torch.ones(3, 3, dtype=img.dtype, device=img.device)
    kernel[1, 1] = 5.0
    kernel = (kernel / 13).expand(img.shape[0], 1, 3, 3)
    smooth = img.clone()
    smooth[:, 1:-1, 1:-1] = F.conv2d(img.unsqueeze(0), kernel, groups=img.shape[0])[0]
    return _blend(smooth, img, _factor(level))


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
