"""Factorize: replace wide Linear/Conv2d layers by two thinner ones (a low-rank product).

A layer with weight ``W`` (``out x in``, convolutions flattened to ``out x in*k*k``)
becomes ``in -> r -> out``: for convolutions a ``k x k`` conv to ``r`` channels, then a
1x1 conv. Both start from the truncated SVD of ``W``, the best rank-``r`` approximation,
so the model computes nearly what it did. A layer is replaced only where that saves
parameters; fewer parameters mean fewer FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.algorithms._surgery import replace_modules
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config

__all__ = [
    "Factorize",
    "FactorizeConfig",
    "FactorizedConv2d",
    "FactorizedLinear",
    "apply_factorize",
    "low_rank_factors",
]


@dataclass(kw_only=True)
class FactorizeConfig:
    factorize_convs: bool = True
    """Factorize `nn.Conv2d` layers (groups == 1)."""
    factorize_linears: bool = True
    """Factorize `nn.Linear` layers."""
    min_channels: int = 256
    """Only layers whose smaller side (in or out features/channels) is at least this."""
    latent_channels: float = 0.25
    """The rank ``r``: an int (>= 1) or, below 1, a fraction of the smaller side."""

    def __post_init__(self) -> None:
        if self.min_channels < 1:
            raise ValueError(f"min_channels must be >= 1, got {self.min_channels}")
        if not self.latent_channels > 0 or (
            self.latent_channels >= 1 and self.latent_channels != int(self.latent_channels)
        ):
            raise ValueError(
                f"latent_channels must be an int >= 1 or a fraction in (0, 1), got "
                f"{self.latent_channels}"
            )

    def rank_for(self, smaller_side: int) -> int:
        if self.latent_channels < 1:
            return max(1, int(smaller_side * self.latent_channels))
        return int(self.latent_channels)


@torch.no_grad()
def low_rank_factors(weight: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a, b)`` with ``b @ a`` the best rank-``rank`` approximation of 2-D ``weight``."""
    u, s, vh = torch.linalg.svd(weight.float(), full_matrices=False)
    root = s[:rank].sqrt()
    return (root[:, None] * vh[:rank]).to(weight.dtype), (u[:, :rank] * root).to(weight.dtype)


class FactorizedLinear(nn.Module):
    """``Linear(in, r, bias=False)`` then ``Linear(r, out)``."""

    def __init__(self, linear: nn.Linear, rank: int):
        super().__init__()
        self.first = nn.Linear(linear.in_features, rank, bias=False)
        self.second = nn.Linear(rank, linear.out_features, bias=linear.bias is not None)
        a, b = low_rank_factors(linear.weight, rank)
        with torch.no_grad():
            self.first.weight.copy_(a)
            self.second.weight.copy_(b)
            if linear.bias is not None:
                self.second.bias.copy_(linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


class FactorizedConv2d(nn.Module):
    """``Conv2d(in, r, k)`` (original stride, padding, dilation) then ``Conv2d(r, out, 1)``."""

    def __init__(self, conv: nn.Conv2d, rank: int):
        super().__init__()
        self.first = nn.Conv2d(
            conv.in_channels,
            rank,
            conv.kernel_size,
            stride=conv.stride,
            padding=conv.padding,
            dilation=conv.dilation,
            padding_mode=conv.padding_mode,
            bias=False,
        )
        self.second = nn.Conv2d(rank, conv.out_channels, 1, bias=conv.bias is not None)
        a, b = low_rank_factors(conv.weight.flatten(1), rank)
        with torch.no_grad():
            self.first.weight.copy_(a.reshape(self.first.weight.shape))
            self.second.weight.copy_(b[:, :, None, None])
            if conv.bias is not None:
                self.second.bias.copy_(conv.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


def apply_factorize(
    model: nn.Module,
    config: FactorizeConfig | None = None,
    /,
    *,
    optimizers: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
    **options: Any,
) -> dict[str, nn.Module]:
    """Factorize ``model``'s wide layers where it saves parameters; returns them by name.

    Takes a `FactorizeConfig` or its fields as keyword arguments.
    """
    config = build_config(FactorizeConfig, config, options)
    min_channels = config.min_channels

    def saving_rank(channels_in: int, channels_out: int, taps: int = 1) -> int | None:
        if min(channels_in, channels_out) < min_channels:
            return None
        rank = config.rank_for(min(channels_in, channels_out))
        fan_in = channels_in * taps
        return rank if rank * (fan_in + channels_out) < fan_in * channels_out else None

    def linear(module: nn.Linear, index: int) -> nn.Module | None:
        rank = saving_rank(module.in_features, module.out_features)
        return FactorizedLinear(module, rank) if rank else None

    def conv(module: nn.Conv2d, index: int) -> nn.Module | None:
        taps = module.weight[0, 0].numel()
        rank = saving_rank(module.in_channels, module.out_channels, taps)
        return FactorizedConv2d(module, rank) if rank and module.groups == 1 else None

    policies = {}
    if config.factorize_linears:
        policies[nn.Linear] = linear
    if config.factorize_convs:
        policies[nn.Conv2d] = conv
    return replace_modules(model, policies, optimizers=optimizers, method="factorize")


class Factorize(ComposableAlgorithm, config=FactorizeConfig):
    """Factorizes wide layers at INIT (see `FactorizeConfig`)."""

    config: FactorizeConfig
    required_on_load = True
    required_events = (Event.INIT,)

    def __init__(self, config: FactorizeConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    def match(self, event: Event, state: State) -> bool:
        return event == Event.INIT

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        model = state.parallelism.unwrap(state.model)
        replaced = apply_factorize(model, self.config, optimizers=state.optimizers)
        logger.log_hyperparameters({"factorize/num_replaced": len(replaced)})
