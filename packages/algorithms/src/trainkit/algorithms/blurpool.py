"""BlurPool (Zhang 2019): low-pass filter before every downsampling, for shift invariance.

Strided convolutions get a 3x3 binomial blur in front of them (`BlurConv2d`); max pools
become a stride-1 max pool followed by a strided blur (`BlurMaxPool2d`). Output shapes
are unchanged and the convolutions keep their weights (the same `Parameter` objects), so
the surgery can be applied to a trained model too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.algorithms._surgery import replace_modules
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config

__all__ = ["BlurConv2d", "BlurMaxPool2d", "BlurPool", "BlurPoolConfig", "apply_blurpool", "blur_2d"]


@dataclass(kw_only=True)
class BlurPoolConfig:
    replace_convs: bool = True
    """Put a blur in front of every strided `nn.Conv2d`."""
    replace_maxpools: bool = True
    """Replace every `nn.MaxPool2d` by a dense max pool followed by a strided blur."""
    min_channels: int = 16
    """Leave convolutions with fewer input channels alone (blurring them costs more than
    it helps, e.g. the RGB stem)."""

    def __post_init__(self) -> None:
        if self.min_channels < 0:
            raise ValueError(f"min_channels must be >= 0, got {self.min_channels}")


def _binomial_filter(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    row = torch.tensor([1.0, 2.0, 1.0], dtype=dtype)
    return (row[:, None] * row[None, :]) / 16.0


def blur_2d(x: torch.Tensor, *, stride: int | tuple[int, int] = 1) -> torch.Tensor:
    """Blur each channel of ``(N, C, H, W)`` with a 3x3 binomial filter (zero padding 1)."""
    channels = x.shape[1]
    weight = _binomial_filter(x.dtype).to(x.device).expand(channels, 1, 3, 3)
    return F.conv2d(x, weight, stride=stride, padding=1, groups=channels)


class BlurConv2d(nn.Module):
    """Blur, then the original (strided) convolution."""

    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        self.conv = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(blur_2d(x))


class BlurMaxPool2d(nn.Module):
    """Max pool at stride 1, then blur at the pool's stride: same output shape as the pool."""

    def __init__(self, pool: nn.MaxPool2d):
        super().__init__()
        if pool.return_indices or pool.ceil_mode:
            raise ValueError("BlurMaxPool2d supports neither return_indices nor ceil_mode")
        self.pool = nn.MaxPool2d(pool.kernel_size, 1, pool.padding, pool.dilation)
        self.stride = pool.stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return blur_2d(self.pool(x), stride=self.stride)


def apply_blurpool(
    model: nn.Module,
    config: BlurPoolConfig | None = None,
    /,
    *,
    optimizers: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
    **options: Any,
) -> dict[str, nn.Module]:
    """Add blur before downsampling in ``model``; returns ``{name: new module}``.

    Takes a `BlurPoolConfig` or its fields as keyword arguments.
    """
    cfg = build_config(BlurPoolConfig, config, options)
    policies = {}
    if cfg.replace_convs:

        def blur_conv(module: nn.Conv2d, index: int) -> nn.Module | None:
            strided = max(_pair(module.stride)) > 1
            wide = module.in_channels >= cfg.min_channels
            return BlurConv2d(module) if strided and wide else None

        policies[nn.Conv2d] = blur_conv
    if cfg.replace_maxpools:

        def blur_pool(module: nn.MaxPool2d, index: int) -> nn.Module | None:
            supported = not (module.ceil_mode or module.return_indices)
            return BlurMaxPool2d(module) if supported else None

        policies[nn.MaxPool2d] = blur_pool
    return replace_modules(model, policies, optimizers=optimizers, method="blurpool")


def _pair(value: int | tuple[int, ...]) -> tuple[int, ...]:
    return (value, value) if isinstance(value, int) else tuple(value)


class BlurPool(ComposableAlgorithm, config=BlurPoolConfig):
    """Applies `apply_blurpool` to the model at INIT (see `BlurPoolConfig`)."""

    config: BlurPoolConfig
    required_on_load = True
    required_events = (Event.INIT,)

    def __init__(self, config: BlurPoolConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    def match(self, event: Event, state: State) -> bool:
        return event == Event.INIT

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        model = state.parallelism.unwrap(state.model)
        replaced = apply_blurpool(model, self.config, optimizers=state.optimizers)
        logger.log_hyperparameters({"blurpool/num_replaced": len(replaced)})
