"""The operations of `_image_ops` on PIL images, for the dataset transforms (needs pillow).

Same names, levels and random draws (torch's generator) as the tensor ops, so an image
gets the same operation whether it is a PIL image in a Dataset or a tensor in a batch:
pixel for pixel for the point and shift operations (autocontrast up to PIL's rounding).
Rotations and shears resample bilinearly about the centre, as AugMix's reference code.
Import it through `_image_ops.pil_ops`, which says how to install pillow when it is missing.
"""

from __future__ import annotations

import torch
from PIL import Image, ImageEnhance, ImageOps

from trainkit.algorithms._image_ops import enhance_factor, posterize_bits, sign, solarize_threshold

__all__ = ["PIL_OPS", "apply_pil_op", "check_pil_image", "from_tensor", "to_tensor"]

Resampling = Image.Resampling
Transform = Image.Transform


def check_pil_image(img: object, method: str) -> None:
    """Raise unless ``img`` is an RGB or grayscale PIL image."""
    if not isinstance(img, Image.Image):
        raise TypeError(f"{method} needs a PIL image or a tensor, got {type(img).__name__}")
    if img.mode not in ("RGB", "L"):
        raise ValueError(
            f"{method} works on RGB and grayscale ('L') PIL images, got mode {img.mode!r}; "
            "convert it first, e.g. img.convert('RGB')"
        )


def to_tensor(img: Image.Image) -> torch.Tensor:
    """``(C, H, W)`` uint8 pixels of an RGB or L image (no numpy or torchvision needed)."""
    width, height = img.size
    pixels = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
    return pixels.view(height, width, len(img.getbands())).permute(2, 0, 1)


def from_tensor(pixels: torch.Tensor, mode: str) -> Image.Image:
    """The PIL image of ``(C, H, W)`` uint8 pixels."""
    _, height, width = pixels.shape
    data = pixels.permute(1, 2, 0).contiguous().numpy().tobytes()
    return Image.frombytes(mode, (width, height), data)


def _affine(img: Image.Image, coefficients: tuple[float, ...], resample) -> Image.Image:
    return img.transform(img.size, Transform.AFFINE, coefficients, resample=resample)


def autocontrast(img: Image.Image, level: float) -> Image.Image:
    return ImageOps.autocontrast(img)


def equalize(img: Image.Image, level: float) -> Image.Image:
    return ImageOps.equalize(img)


def posterize(img: Image.Image, level: float) -> Image.Image:
    return ImageOps.posterize(img, posterize_bits(level))


def solarize(img: Image.Image, level: float) -> Image.Image:
    return ImageOps.solarize(img, solarize_threshold(level))


def rotate(img: Image.Image, level: float) -> Image.Image:
    return img.rotate(30.0 * level / 10 * sign(), resample=Resampling.BILINEAR)


def shear_x(img: Image.Image, level: float) -> Image.Image:
    s = 0.3 * level / 10 * sign()
    return _affine(img, (1, s, -s * img.size[1] / 2, 0, 1, 0), Resampling.BILINEAR)


def shear_y(img: Image.Image, level: float) -> Image.Image:
    s = 0.3 * level / 10 * sign()
    return _affine(img, (1, 0, 0, s, 1, -s * img.size[0] / 2), Resampling.BILINEAR)


def translate_x(img: Image.Image, level: float) -> Image.Image:
    pixels = int(level / 10 * img.size[0] / 3 * sign())
    return _affine(img, (1, 0, -pixels, 0, 1, 0), Resampling.NEAREST)


def translate_y(img: Image.Image, level: float) -> Image.Image:
    pixels = int(level / 10 * img.size[1] / 3 * sign())
    return _affine(img, (1, 0, 0, 0, 1, -pixels), Resampling.NEAREST)


def color(img: Image.Image, level: float) -> Image.Image:
    return ImageEnhance.Color(img).enhance(enhance_factor(level))


def contrast(img: Image.Image, level: float) -> Image.Image:
    return ImageEnhance.Contrast(img).enhance(enhance_factor(level))


def brightness(img: Image.Image, level: float) -> Image.Image:
    return ImageEnhance.Brightness(img).enhance(enhance_factor(level))


def sharpness(img: Image.Image, level: float) -> Image.Image:
    return ImageEnhance.Sharpness(img).enhance(enhance_factor(level))


PIL_OPS = {
    "autocontrast": autocontrast,
    "equalize": equalize,
    "posterize": posterize,
    "rotate": rotate,
    "solarize": solarize,
    "shear_x": shear_x,
    "shear_y": shear_y,
    "translate_x": translate_x,
    "translate_y": translate_y,
    "color": color,
    "contrast": contrast,
    "brightness": brightness,
    "sharpness": sharpness,
}
"""Every operation of `_image_ops.ALL_OPS`, on PIL images."""


def apply_pil_op(name: str, img: Image.Image, level: float) -> Image.Image:
    """``PIL_OPS[name](img, level)``."""
    return PIL_OPS[name](img, level)
