"""Squeeze-and-Excitation (Hu et al. 2018): channel attention after convolutions.

Every `nn.Conv2d` whose input and output channels are both at least ``min_channels`` is
followed by a `SqueezeExcite2d` block: global average pool, a bottleneck MLP without
biases (``C -> latent -> C``, ReLU between), a sigmoid gate per channel, as Composer builds
it. The new parameters join the first parameter group of the run's optimizer. Applying it
twice adds no second block to a convolution.

Differs from Composer: a fractional ``latent_channels`` never rounds to a zero-width
bottleneck (at least 1 channel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.algorithms._surgery import replace_modules
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary

__all__ = [
    "SqueezeExcite",
    "SqueezeExcite2d",
    "SqueezeExciteConfig",
    "SqueezeExciteConv2d",
    "apply_squeeze_excite",
]


@dataclass(kw_only=True)
class SqueezeExciteConfig:
    latent_channels: float = primary(64)
    """Width of the bottleneck: an int (>= 1) or, below 1, a fraction of the convolution's
    output channels."""
    min_channels: int = 128
    """Only convolutions with at least this many input and output channels get a block
    (``min(in_channels, out_channels) >= min_channels``, Composer's rule)."""

    def __post_init__(self) -> None:
        if not self.latent_channels > 0:
            raise ValueError(f"latent_channels must be positive, got {self.latent_channels}")
        if self.latent_channels >= 1 and self.latent_channels != int(self.latent_channels):
            raise ValueError(
                f"latent_channels {self.latent_channels} must be an int, or a fraction below 1"
            )
        if self.min_channels < 1:
            raise ValueError(f"min_channels must be >= 1, got {self.min_channels}")

    def latent_for(self, channels: int) -> int:
        if self.latent_channels < 1:
            return max(1, int(channels * self.latent_channels))
        return int(self.latent_channels)


class SqueezeExcite2d(nn.Module):
    """Scales each channel of ``(N, C, H, W)`` by a gate computed from all channels' means."""

    def __init__(self, channels: int, latent_channels: int):
        super().__init__()
        self.squeeze = nn.Linear(channels, latent_channels, bias=False)
        self.excite = nn.Linear(latent_channels, channels, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.excite(torch.relu(self.squeeze(x.mean(dim=(2, 3))))))
        return x * gate[:, :, None, None]


class SqueezeExciteConv2d(nn.Module):
    """A convolution followed by a `SqueezeExcite2d` block."""

    def __init__(self, conv: nn.Conv2d, latent_channels: int):
        super().__init__()
        self.conv = conv
        self.se = SqueezeExcite2d(conv.out_channels, latent_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se(self.conv(x))


def apply_squeeze_excite(
    model: nn.Module,
    config: SqueezeExciteConfig | None = None,
    /,
    *,
    optimizers: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
    **options: Any,
) -> dict[str, nn.Module]:
    """Add a squeeze-excite block after each wide enough conv; returns them by name.

    Takes a `SqueezeExciteConfig` or its fields as keyword arguments.
    """
    cfg = build_config(SqueezeExciteConfig, config, options)
    done = {id(m.conv) for m in model.modules() if isinstance(m, SqueezeExciteConv2d)}

    def add_block(conv: nn.Conv2d, index: int) -> nn.Module | None:
        if min(conv.in_channels, conv.out_channels) < cfg.min_channels:
            return None
        return SqueezeExciteConv2d(conv, cfg.latent_for(conv.out_channels))

    return replace_modules(
        model,
        {lambda m: isinstance(m, nn.Conv2d) and id(m) not in done: add_block},
        optimizers=optimizers,
        method="squeeze_excite",
    )


class SqueezeExcite(ComposableAlgorithm, config=SqueezeExciteConfig):
    """Adds squeeze-excite blocks at INIT (see `SqueezeExciteConfig`)."""

    config: SqueezeExciteConfig
    required_on_load = True
    required_events = (Event.INIT,)

    def __init__(self, config: SqueezeExciteConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    match_events = frozenset({Event.INIT})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        model = state.parallelism.unwrap(state.model)
        replaced = apply_squeeze_excite(model, self.config, optimizers=state.optimizers)
        logger.log_hyperparameters({"squeeze_excite/num_replaced": len(replaced)})
