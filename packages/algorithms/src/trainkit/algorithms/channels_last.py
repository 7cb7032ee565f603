"""Channels-last memory format (NHWC) for convolutional models.

Converts the model's 4-D parameters and buffers to `torch.channels_last` in place (the
same `Parameter` objects, so optimizers need no re-binding). cuDNN then picks NHWC
kernels, which are faster with Tensor Cores; convolutions also return channels-last
activations, so the layout propagates through the network without touching the data.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State

__all__ = ["ChannelsLast", "ChannelsLastConfig", "apply_channels_last"]


@dataclass(kw_only=True)
class ChannelsLastConfig:
    """Channels-last has no options; the class exists so every method has a config (and a
    ``{name: channels_last}`` entry of a config file builds it like any other)."""


def apply_channels_last(model: nn.Module) -> int:
    """Put ``model``'s 4-D tensors in channels-last format; returns how many there are."""
    count = sum(1 for t in [*model.parameters(), *model.buffers()] if t.ndim == 4)
    if count == 0:
        warnings.warn(
            f"channels_last found no 4-D parameter in {type(model).__name__} (no Conv2d?); "
            "it has no effect on this model",
            stacklevel=2,
        )
        return 0
    model.to(memory_format=torch.channels_last)
    return count


class ChannelsLast(ComposableAlgorithm, config=ChannelsLastConfig):
    """Converts the model to channels-last at INIT.

    Not ``required_on_load``: only the memory layout changes, not the parameters or their
    names, so its checkpoints load into a model without it (and the reverse).
    """

    config: ChannelsLastConfig
    required_events = (Event.INIT,)

    def __init__(self, config: ChannelsLastConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    match_events = frozenset({Event.INIT})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        count = apply_channels_last(state.parallelism.unwrap(state.model))
        logger.log_hyperparameters({"channels_last/num_tensors": count})
