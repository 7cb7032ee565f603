"""BlurPool (Zhang 2019): low-pass filter before every downsampling, for shift invariance.

Strided convolutions get a 3x3 binomial blur in front of them (`BlurConv2d`); max pools
become a stride-1 max pool followed by a strided blur (`BlurMaxPool2d`). Output shapes
are unchanged and the convolutions keep their weights (the same `Parameter` objects), so
the surgery can be applied to a trained model too. Applying it twice changes nothing more.

On torchvision's ResNets this blurs the stem's max pool, each downsampling block's strided
3x3 convolution and its strided 1x1 shortcut convolution (the stem convolution has 3 input
channels, below ``min_channels``), as Composer does.

The blur is a depthwise convolution with a filter built once per layer (a non-persistent
buffer: checkpoints hold only the convolutions' own weights). ``blur_first=True`` (the
default, as in Composer) blurs the input and keeps the convolution strided, which costs
one depthwise pass over the input; ``blur_first=False`` is the paper's order (convolution at
stride 1, then a strided blur), about ``stride**2`` times the convolution's work.
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
from trainkit.core.config import build_config, primary

__all__ = ["BlurConv2d", "BlurMaxPool2d", "BlurPool", "BlurPoolConfig", "apply_blurpool", "blur_2d"]


@dataclass(kw_only=True)
class BlurPoolConfig:
    replace_convs: bool = primary(True)
    """Put a blur in front of every strided `nn.Conv2d`."""
    replace_maxpools: bool = True
    """Replace every `nn.MaxPool2d` by a dense max pool followed by a strided blur."""
    blur_first: bool = True
    """Blur the input, then the strided convolution (cheap; Composer's default). False: the
    convolution at stride 1, then a strided blur of its output (the paper's order; about
    ``stride**2`` times the convolution's FLOPs)."""
    min_channels: int = 16
    """Leave convolutions with fewer input channels alone (blurring them costs more than
    it helps, e.g. the RGB stem)."""

    def __post_init__(self) -> None:
        if self.min_channels < 0:
            raise ValueError(f"min_channels must be >= 0, got {self.min_channels}")
        if not (self.replace_convs or self.replace_maxpools):
            raise ValueError(
                "replace_convs and replace_maxpools are both False, so blurpool would change "
                "nothing; enable at least one"
            )


def _binomial_filter(channels: int = 1) -> torch.Tensor:
    row = torch.tensor([1.0, 2.0, 1.0])
    return ((row[:, None] * row[None, :]) / 16.0).expand(channels, 1, 3, 3).contiguous()


def blur_2d(
    x: torch.Tensor, *, stride: int | tuple[int, int] = 1, filter: torch.Tensor | None = None
) -> torch.Tensor:
    """Blur each channel of ``(N, C, H, W)`` with a 3x3 binomial filter (zero padding 1).

    ``filter`` is the ``(C, 1, 3, 3)`` depthwise filter, when the caller keeps one.
    """
    channels = x.shape[1]
    if filter is None or filter.shape[0] != channels:
        filter = _binomial_filter(channels).to(x.device)
    return F.conv2d(x, filter.to(x.dtype), None, stride, 1, 1, channels)


class BlurConv2d(nn.Module):
    """A strided convolution with a blur: before it, or (``blur_first=False``) after it at
    stride 1, the blur taking the stride."""

    def __init__(self, conv: nn.Conv2d, blur_first: bool = True):
        super().__init__()
        self.conv = conv
        self.blur_first = blur_first
        channels = conv.in_channels if blur_first else conv.out_channels
        self.register_buffer("blur_filter", _binomial_filter(channels), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.blur_first:
            return self.conv(blur_2d(x, filter=self.blur_filter))
        conv = self.conv
        padding: Any = conv.padding
        if conv.padding_mode != "zeros":
            x = F.pad(x, conv._reversed_padding_repeated_twice, mode=conv.padding_mode)
            padding = 0
        dense = F.conv2d(x, conv.weight, conv.bias, 1, padding, conv.dilation, conv.groups)
        return blur_2d(dense, stride=conv.stride, filter=self.blur_filter)


class BlurMaxPool2d(nn.Module):
    """Max pool at stride 1, then blur at the pool's stride: same output shape as the pool."""

    def __init__(self, pool: nn.MaxPool2d):
        super().__init__()
        if pool.return_indices or pool.ceil_mode:
            raise ValueError("BlurMaxPool2d supports neither return_indices nor ceil_mode")
        self.kernel_size, self.stride = pool.kernel_size, pool.stride
        self.padding, self.dilation = pool.padding, pool.dilation
        self.register_buffer("blur_filter", _binomial_filter(1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dense = F.max_pool2d(x, self.kernel_size, 1, self.padding, self.dilation)
        weight = self.blur_filter.expand(x.shape[1], 1, 3, 3)
        return blur_2d(dense, stride=self.stride, filter=weight)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


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
    # Convolutions an earlier application already wrapped are not wrapped again.
    done = {id(m.conv) for m in model.modules() if isinstance(m, BlurConv2d)}
    policies = {}
    if cfg.replace_convs:

        def blur_conv(module: nn.Conv2d, index: int) -> nn.Module | None:
            strided = max(_pair(module.stride)) > 1
            wide = module.in_channels >= cfg.min_channels
            return BlurConv2d(module, cfg.blur_first) if strided and wide else None

        policies[lambda m: isinstance(m, nn.Conv2d) and id(m) not in done] = blur_conv
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

    match_events = frozenset({Event.INIT})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        model = state.parallelism.unwrap(state.model)
        replaced = apply_blurpool(model, self.config, optimizers=state.optimizers)
        logger.log_hyperparameters({"blurpool/num_replaced": len(replaced)})
