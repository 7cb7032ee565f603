"""Stochastic depth (Huang et al. 2016): skip residual blocks at random while training.

Each target block ``x -> x + f(x)`` is wrapped in a `StochasticBlock`. In training, "block"
mode skips the whole block (it is not computed: the saving) with probability ``p`` and
otherwise returns ``x + f(x) / (1 - p)``; "sample" mode drops ``f(x)`` per sample (as
timm's DropPath). In eval the block runs as it is, so the trained model needs nothing
special at inference. ``f(x)`` is read as ``block(x) - x``: the block must keep the
input's shape (blocks that downsample cannot be skipped and raise).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.algorithms._surgery import replace_modules
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config

__all__ = [
    "StochasticBlock",
    "StochasticDepth",
    "StochasticDepthConfig",
    "apply_stochastic_depth",
]

Target = str | type[nn.Module] | Callable[[nn.Module], bool]


@dataclass(kw_only=True)
class StochasticDepthConfig:
    target: Target = "Bottleneck"
    """The residual blocks: a class name matched against each module's class (``"Bottleneck"``,
    torchvision ResNet-50's block, or ``"BasicBlock"``; a dotted ``"module.Class"`` matches
    the full name), a module class, or a predicate on modules."""
    drop_rate: float = 0.2
    """Drop probability of the deepest block, in [0, 1)."""
    drop_distribution: Literal["linear", "uniform"] = "linear"
    """"linear": block i of n drops with ``drop_rate * (i + 1) / n`` (deeper blocks more
    often, as in the paper); "uniform": every block drops with ``drop_rate``."""
    mode: Literal["block", "sample"] = "block"
    """"block": one draw per batch, skipping the computation; "sample": one per sample."""

    def __post_init__(self) -> None:
        if not (isinstance(self.target, str | type) or callable(self.target)) or self.target == "":
            raise ValueError(
                f"target must be a class name, a module class or a predicate, got {self.target!r}"
            )
        if not 0.0 <= self.drop_rate < 1.0:
            raise ValueError(f"drop_rate must be in [0, 1), got {self.drop_rate}")
        if self.drop_distribution not in ("linear", "uniform"):
            raise ValueError(
                f"drop_distribution {self.drop_distribution!r} is not 'linear' or 'uniform'"
            )
        if self.mode not in ("block", "sample"):
            raise ValueError(f"mode {self.mode!r} is not 'block' or 'sample'")


class StochasticBlock(nn.Module):
    """A residual block that is skipped with probability ``drop_rate`` in training."""

    def __init__(self, block: nn.Module, drop_rate: float, mode: str = "block"):
        super().__init__()
        self.block, self.drop_rate, self.mode = block, drop_rate, mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.drop_rate == 0.0:
            return self.block(x)
        keep = 1.0 - self.drop_rate
        if self.mode == "block" and torch.rand(()).item() >= keep:
            return x
        out = self.block(x)
        if out.shape != x.shape:
            raise ValueError(
                f"stochastic_depth: {type(self.block).__name__} maps shape {tuple(x.shape)} to "
                f"{tuple(out.shape)}; only blocks that keep the shape (x + f(x)) can be skipped. "
                "Narrow `target` to exclude it"
            )
        residual = out - x
        if self.mode == "sample":
            shape = (x.shape[0],) + (1,) * (x.ndim - 1)
            mask = torch.full(shape, keep, dtype=residual.dtype, device=x.device)
            residual = residual * torch.bernoulli(mask)
        return x + residual / keep


def _matches(target: Target, module: nn.Module) -> bool:
    if isinstance(target, str):
        cls = type(module)
        return target in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}")
    return isinstance(module, target) if isinstance(target, type) else bool(target(module))


def apply_stochastic_depth(
    model: nn.Module,
    config: StochasticDepthConfig | None = None,
    /,
    *,
    optimizers: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None,
    **options: Any,
) -> dict[str, nn.Module]:
    """Wrap every ``target`` block of ``model`` in a `StochasticBlock`; returns them by name.

    Takes a `StochasticDepthConfig` or its fields as keyword arguments (``target`` at least).
    """
    cfg = build_config(StochasticDepthConfig, config, options)
    target = cfg.target
    count = sum(1 for _, m in model.named_modules() if _matches(target, m))

    def wrap(block: nn.Module, index: int) -> nn.Module:
        rate = (
            cfg.drop_rate * (index + 1) / count
            if cfg.drop_distribution == "linear"
            else cfg.drop_rate
        )
        return StochasticBlock(block, rate, cfg.mode)

    return replace_modules(
        model,
        # Applying twice must not wrap a block twice.
        {lambda m: _matches(target, m) and not isinstance(m, StochasticBlock): wrap},
        optimizers=optimizers,
        method="stochastic_depth",
    )


class StochasticDepth(ComposableAlgorithm, config=StochasticDepthConfig):
    """Wraps residual blocks at INIT (see `StochasticDepthConfig`)."""

    config: StochasticDepthConfig
    required_on_load = True
    required_events = (Event.INIT,)

    def __init__(self, config: StochasticDepthConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    def match(self, event: Event, state: State) -> bool:
        return event == Event.INIT

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        model = state.parallelism.unwrap(state.model)
        replaced = apply_stochastic_depth(model, self.config, optimizers=state.optimizers)
        logger.log_hyperparameters({"stochastic_depth/num_replaced": len(replaced)})
