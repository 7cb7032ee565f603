"""ColOut: drop random rows and columns of the training images (a cheap, shrinking augmentation).

``round(p_row * H)`` rows and ``round(p_col * W)`` columns, chosen at random, are removed;
the rest keep their order. Images get smaller, so steps get cheaper, and with fixed shares
every batch has the same size. Segmentation masks can lose the same rows and columns
(``resize_targets``).

Two places to run it, as in Composer: on the device batch at BATCH_START (``batch=True``,
the default; the same rows and columns for the whole batch, so it stays one tensor), or
per sample in the loader's workers: `ColOutTransform` on PIL images or (C, H, W) tensors,
which the algorithm with ``batch=False`` puts into a torchvision training dataset at
FIT_START.

Differs from Composer: the number dropped is ``round(p * size)`` (Composer keeps
``int((1 - p) * size)``, which floating point can make one fewer), and ``resize_targets``
is a bool (Composer also has "auto").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from trainkit.algorithms._batch import Key, get_item, set_item
from trainkit.algorithms._image_ops import pil_ops
from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.algorithms._vision import add_dataset_transform
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary

__all__ = ["ColOut", "ColOutConfig", "ColOutTransform", "colout_batch"]

Image = TypeVar("Image")


@dataclass(kw_only=True)
class ColOutConfig:
    p_row: float = primary(0.15)
    """Share of rows dropped; in [0, 1)."""
    p_col: float = 0.15
    """Share of columns dropped; in [0, 1)."""
    resize_targets: bool = False
    """Drop the same rows and columns from the targets (segmentation masks); ``batch=True``
    only (a dataset transform receives the image alone)."""
    batch: bool = True
    """True: drop from each device batch at BATCH_START. False: put a `ColOutTransform` into
    the training dataset's transforms at FIT_START (needs torchvision)."""
    input_key: Key = 0
    """Where the batch keeps its images, shaped (N, C, H, W)."""
    target_key: Key = 1
    """Where the batch keeps its targets."""

    def __post_init__(self) -> None:
        for name in ("p_row", "p_col"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.resize_targets and not self.batch:
            raise ValueError(
                "resize_targets needs batch=True: a dataset transform receives the image alone; "
                "apply ColOutTransform to (image, mask) pairs yourself"
            )


def _kept(size: int, p: float, device: torch.device) -> torch.Tensor:
    keep = size - round(p * size)
    return torch.randperm(size, device=device)[:keep].sort().values


def colout_batch(
    x: torch.Tensor,
    y: torch.Tensor | None = None,
    config: ColOutConfig | None = None,
    /,
    **options: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x`` (..., H, W) without ``round(p_row * H)`` random rows and ``round(p_col * W)`` columns.

    Takes a `ColOutConfig` or its fields as keyword arguments. Returns ``(x, y)``; with
    ``resize_targets``, ``y`` (..., H, W) loses the same ones.
    """
    cfg = build_config(ColOutConfig, config, options)
    if x.ndim < 3:
        raise ValueError(f"colout needs images shaped (N, C, H, W), got shape {tuple(x.shape)}")
    x, dropped = _drop(x, y if cfg.resize_targets else None, cfg.p_row, cfg.p_col)
    return x, (dropped if cfg.resize_targets else y)


def _drop(
    x: torch.Tensor, y: torch.Tensor | None, p_row: float, p_col: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x`` and ``y`` (..., H, W) without the same random rows and columns."""
    rows, cols = _kept(x.shape[-2], p_row, x.device), _kept(x.shape[-1], p_col, x.device)
    x = x.index_select(-2, rows).index_select(-1, cols)
    if y is not None:
        y = y.index_select(-2, rows.to(y.device)).index_select(-1, cols.to(y.device))
    return x, y


def _as_tensor(item: Any) -> torch.Tensor:
    if isinstance(item, torch.Tensor):
        if item.ndim < 2:
            raise ValueError(
                f"ColOutTransform needs images (..., H, W), got shape {tuple(item.shape)}"
            )
        return item if item.ndim >= 3 else item.unsqueeze(0)
    ops = pil_ops()
    if not isinstance(item, ops.Image.Image):
        raise TypeError(f"ColOutTransform needs PIL images or tensors, got {type(item).__name__}")
    if item.mode not in ("RGB", "L", "P"):
        raise ValueError(
            f"ColOutTransform works on 8-bit PIL images (modes RGB, L, P), got mode "
            f"{item.mode!r}; convert it first"
        )
    return ops.to_tensor(item)


def _like(out: torch.Tensor, original: Any) -> Any:
    """``out`` as the same kind of image as ``original``."""
    if isinstance(original, torch.Tensor):
        return out if original.ndim >= 3 else out.squeeze(0)
    image = pil_ops().from_tensor(out, original.mode)
    if original.mode == "P":
        image.putpalette(original.getpalette())
    return image


class ColOutTransform:
    """A dataset transform: drops random rows and columns of one image, or of an
    ``(image, mask)`` pair alike (the mask as a PIL image or an (..., H, W) tensor).

    Images are PIL images or tensors (C, H, W) and come back as the same kind. Takes a
    `ColOutConfig` or its fields as keyword arguments (``p_row``, ``p_col``).
    """

    def __init__(self, config: ColOutConfig | None = None, /, **options: Any) -> None:
        self.config = build_config(ColOutConfig, config, options)

    def __call__(self, sample: Image | tuple[Image, Image]) -> Image | tuple[Image, Image]:
        pair = isinstance(sample, tuple)
        if pair and len(sample) != 2:  # type: ignore[arg-type]
            raise ValueError(
                f"ColOutTransform takes an image or an (image, mask) pair, got a tuple of "
                f"{len(sample)}"  # type: ignore[arg-type]
            )
        items = list(sample) if pair else [sample]  # type: ignore[arg-type]
        tensors = [_as_tensor(item) for item in items]
        if pair and tensors[0].shape[-2:] != tensors[1].shape[-2:]:
            raise ValueError(
                "ColOutTransform needs the image and the mask at the same size, got "
                f"{tuple(tensors[0].shape[-2:])} and {tuple(tensors[1].shape[-2:])}"
            )
        cfg = self.config
        x, y = _drop(tensors[0], tensors[1] if pair else None, cfg.p_row, cfg.p_col)
        out = [_like(x, items[0])] + ([_like(y, items[1])] if pair else [])
        return tuple(out) if pair else out[0]  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"ColOutTransform(p_row={self.config.p_row}, p_col={self.config.p_col})"


class ColOut(ComposableAlgorithm, config=ColOutConfig):
    """Drops random rows and columns of training images (see `ColOutConfig`)."""

    config: ColOutConfig

    def __init__(self, config: ColOutConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._transform = ColOutTransform(self.config)

    @property
    def match_events(self) -> frozenset[Event]:  # type: ignore[override]
        return frozenset({Event.BATCH_START if self.config.batch else Event.FIT_START})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        cfg = self.config
        if not cfg.batch:
            add_dataset_transform(state, self._transform, "colout")
            return
        x = get_item(state.batch, cfg.input_key, "colout")
        y = get_item(state.batch, cfg.target_key, "colout") if cfg.resize_targets else None
        x, y = colout_batch(x, y, cfg)
        state.batch = set_item(state.batch, cfg.input_key, x)
        if cfg.resize_targets:
            state.batch = set_item(state.batch, cfg.target_key, y)
