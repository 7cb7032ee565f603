"""`ImageVisualizer`: a few input images (and segmentation masks) to the destinations."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from trainkit.core import Callback, Logger, State, Time
from trainkit.loggers._common import batch_or_epoch_interval, starts_interval

__all__ = ["ImageVisualizer", "ImageVisualizerConfig", "as_images", "color_masks"]

_MODES = ("input", "segmentation")


@dataclass(kw_only=True)
class ImageVisualizerConfig:
    interval: str | int | Time = "100ba"
    """Which training batches are shown: the first, then every ``interval`` (``"100ba"``),
    or the first batch of every ``interval`` epochs (``"1ep"``; an int counts epochs).
    Every evaluation shows its first batch."""
    mode: Literal["input", "segmentation"] = "input"
    """``"input"``: the images; ``"segmentation"``: also the predicted and the target
    masks, as colour images (one colour per class, black for ignored pixels)."""
    num_images: int = 8
    """Images per batch shown (fewer when the batch is smaller)."""
    channels_last: bool = False
    """The images (and the model's scores, in segmentation) are (N, H, W, C)."""
    input_key: int | str = 0
    """Where the batch keeps its images (a position or a dict key)."""
    target_key: int | str = 1
    """Where the batch keeps its targets (segmentation: class indices (N, H, W) or one-hot
    scores)."""
    rescale: bool = True
    """Stretch each floating-point image to [0, 1] by its own minimum and maximum (inputs
    are usually normalised); False: show values as they are (floats expected in [0, 1])."""

    def __post_init__(self) -> None:
        batch_or_epoch_interval(self.interval, "ImageVisualizer")
        if self.mode not in _MODES:
            raise ValueError(
                f"mode {self.mode!r} is not valid; use one of {', '.join(map(repr, _MODES))}"
            )
        if isinstance(self.num_images, bool) or not (
            isinstance(self.num_images, int) and self.num_images >= 1
        ):
            raise ValueError(f"num_images {self.num_images!r} is not valid; use an int >= 1")


def as_images(
    value: Any, count: int, *, channels_last: bool = False, rescale: bool = True
) -> torch.Tensor:
    """The first ``count`` images of a batch as a float (N, C, H, W) tensor on the CPU."""
    if not isinstance(value, torch.Tensor) or value.ndim not in (3, 4):
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(
            f"ImageVisualizer expects images shaped (N, C, H, W), (N, H, W, C) with "
            f"channels_last, or (N, H, W); got {shape}. Set input_key to where the batch "
            "keeps its images"
        )
    images = value[:count].detach().cpu()
    if images.ndim == 3:
        images = images.unsqueeze(1)
    elif channels_last:
        images = images.permute(0, 3, 1, 2)
    if not images.is_floating_point():
        return images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
    images = images.float()
    if rescale:
        low = images.amin(dim=(1, 2, 3), keepdim=True)
        high = images.amax(dim=(1, 2, 3), keepdim=True)
        images = (images - low) / (high - low).clamp_min(1e-12)
    return images


def color_masks(masks: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Class-index masks (N, H, W) as RGB images (N, 3, H, W): a fixed colour per class,
    black where the index is out of range (ignored pixels)."""
    generator = torch.Generator().manual_seed(0)
    palette = 0.25 + 0.75 * torch.rand(num_classes + 1, 3, generator=generator)
    palette[num_classes] = 0.0
    masks = masks.detach().cpu().long()
    index = torch.where((masks >= 0) & (masks < num_classes), masks, num_classes)
    return palette[index].permute(0, 3, 1, 2)


class ImageVisualizer(Callback, config=ImageVisualizerConfig):
    """Sends a few images of the batch to every destination's ``log_images``.

    Training: at the chosen batches (``interval``), the first ``num_images`` images of the
    batch as ``Images/Train`` (before the forward pass, so an algorithm's changes to the
    inputs are shown), logged at the batch's number. Evaluation: the first batch of each
    evaluation as ``Images/Eval`` (``Images/Eval/<label>`` for an evaluator not named
    ``"eval"``). In ``"segmentation"`` mode they are logged once the model has run, with
    ``.../prediction`` (the argmax of the model's scores) and ``.../target`` as colour
    images beside them. Images reach the destinations as float (N, C, H, W) tensors on
    the CPU. Keys as Composer's; Composer's segmentation masks are wandb overlays, here they
    are separate images every destination can show. Options: `ImageVisualizerConfig`.
    """

    config: ImageVisualizerConfig

    def __init__(self, config: ImageVisualizerConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._every = batch_or_epoch_interval(self.config.interval, "ImageVisualizer")
        self._last_batch: int | None = None
        self._eval_shown = False
        self._segmentation = self.config.mode == "segmentation"

    def before_forward(self, state: State, logger: Logger) -> None:
        if not self._segmentation and self._due(state):
            self._log(state, logger, "Images/Train", state.timestamp.batch + 1)

    def after_forward(self, state: State, logger: Logger) -> None:
        if self._segmentation and self._due(state):
            self._log(state, logger, "Images/Train", state.timestamp.batch + 1)

    def eval_start(self, state: State, logger: Logger) -> None:
        self._eval_shown = False

    def eval_before_forward(self, state: State, logger: Logger) -> None:
        if not self._segmentation and not self._eval_shown:
            self._eval_shown = True
            self._log(state, logger, self._eval_name(state), state.timestamp.batch)

    def eval_after_forward(self, state: State, logger: Logger) -> None:
        if self._segmentation and not self._eval_shown:
            self._eval_shown = True
            self._log(state, logger, self._eval_name(state), state.timestamp.batch)

    def _due(self, state: State) -> bool:
        batch = state.timestamp.batch
        if batch == self._last_batch or not starts_interval(self._every, state):
            return False  # a later microbatch of a shown batch, or not a chosen batch
        self._last_batch = batch
        return True

    @staticmethod
    def _eval_name(state: State) -> str:
        label = state.dataloader_label
        return "Images/Eval" if label == "eval" else f"Images/Eval/{label}"

    def _log(self, state: State, logger: Logger, name: str, step: int) -> None:
        config = self.config
        images = as_images(
            _get(state.batch, config.input_key, "input_key"),
            config.num_images,
            channels_last=config.channels_last,
            rescale=config.rescale,
        )
        logger.log_images(name, images, step=step)
        if not self._segmentation:
            return
        scores = state.outputs
        if not isinstance(scores, torch.Tensor) or scores.ndim != 4:
            raise ValueError(
                "ImageVisualizer(mode='segmentation') needs the model's outputs to be "
                f"scores shaped (N, classes, H, W); got {_describe(scores)}"
            )
        count = images.shape[0]
        class_dim = 3 if config.channels_last else 1
        num_classes = scores.shape[class_dim]
        targets = _get(state.batch, config.target_key, "target_key")[:count]
        if targets.ndim == scores.ndim:  # one-hot or probabilities
            targets = targets.argmax(dim=class_dim)
        predictions = scores[:count].argmax(dim=class_dim)
        logger.log_images(f"{name}/prediction", color_masks(predictions, num_classes), step=step)
        logger.log_images(f"{name}/target", color_masks(targets, num_classes), step=step)


def _get(batch: Any, key: int | str, what: str) -> Any:
    try:
        return batch[key]
    except (KeyError, IndexError, TypeError) as err:
        if isinstance(batch, Mapping):
            holds = f"keys {sorted(map(str, batch))}"
        else:
            holds = f"a {type(batch).__name__}"
        raise ValueError(
            f"ImageVisualizer {what}={key!r} does not index the batch ({holds}); set {what} "
            "to where the batch keeps it"
        ) from err


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return type(value).__name__
