"""Stochastic depth (Huang et al. 2016): drop the residual branch of blocks at random in training.

Each target block is wrapped in a `StochasticBlock`. In training, "block" mode drops the
whole residual branch with probability ``p`` (it is not computed: the saving) and keeps
the shortcut; "sample" mode drops the branch per sample. As in the paper and Composer,
kept branches are not rescaled in training, and in eval every branch is multiplied by its
survival probability ``1 - p``: evaluation is deterministic and sees the expected block.

torchvision's ResNet blocks (`Bottleneck` and `BasicBlock`, found by their structure:
``conv1``/``bn1``/``conv2``/``bn2`` [``conv3``/``bn3``], ``relu``, ``downsample``) are split
into branch and shortcut, so the downsampling blocks work too: a dropped block returns
``relu(downsample(x))``, and every output passes the block's post-add ReLU, so it stays
non-negative as the block's own output does. Any other target is read as ``x + f(x)`` with
no activation after the addition (pre-activation and transformer blocks): ``f(x)`` is
``block(x) - x``, so such a block must keep its input's shape.

``drop_warmup`` ramps every block's rate linearly from 0 to its final value over that part
of training (Composer's ``drop_warmup``), updated at BATCH_START.

Differs from Composer: blocks are found by class name or structure rather than only
torchvision's `Bottleneck`, `BasicBlock` is supported, ``drop_warmup`` also works in
"sample" mode, and the wrapper adds a ``block.`` level to the parameter names (a checkpoint
loads only into a model with the method applied: ``required_on_load``). Under DDP, "block"
mode leaves the dropped blocks' parameters without gradients: use
``find_unused_parameters=True``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.algorithms._surgery import replace_modules
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary
from trainkit.core.interval import as_fraction

__all__ = [
    "StochasticBlock",
    "StochasticDepth",
    "StochasticDepthConfig",
    "apply_stochastic_depth",
]

Target = str | type[nn.Module] | Callable[[nn.Module], bool]

# Composer's name for torchvision's Bottleneck.
_ALIASES = {"ResNetBottleneck": "Bottleneck"}


@dataclass(kw_only=True)
class StochasticDepthConfig:
    target: Target | list[Target] = primary("Bottleneck")
    """The residual blocks: a class name matched against each module's class (``"Bottleneck"``,
    torchvision ResNet-50's block, also as Composer's ``"ResNetBottleneck"``; ``"BasicBlock"``,
    ResNet-18's; a dotted ``"module.Class"`` matches the full name), a module class, a
    predicate on modules, or a list of these."""
    drop_rate: float = 0.2
    """Drop probability of the deepest block, in [0, 1)."""
    drop_distribution: Literal["linear", "uniform"] = "linear"
    """"linear": block i of n drops with ``drop_rate * (i + 1) / n`` (deeper blocks more
    often, as in the paper); "uniform": every block drops with ``drop_rate``."""
    mode: Literal["block", "sample"] = "block"
    """"block": one draw per batch, skipping the branch's computation; "sample": one per
    sample (as in EfficientNet)."""
    drop_warmup: str | float = 0.0
    """Ramp the rates up linearly from 0 over this much of training: a fraction of the run
    (``0.1``) or a duration (``"0.1dur"``, ``"500ba"``, ``"2ep"``). 0: no ramp."""

    def __post_init__(self) -> None:
        targets = self.target if isinstance(self.target, list | tuple) else [self.target]
        for target in targets:
            if not (isinstance(target, str | type) or callable(target)) or target == "":
                raise ValueError(
                    "target must be a class name, a module class, a predicate or a list of "
                    f"these, got {target!r}"
                )
        if not targets:
            raise ValueError("target is an empty list; name at least one block class")
        if not 0.0 <= self.drop_rate < 1.0:
            raise ValueError(f"drop_rate must be in [0, 1), got {self.drop_rate}")
        if self.drop_distribution not in ("linear", "uniform"):
            raise ValueError(
                f"drop_distribution {self.drop_distribution!r} is not 'linear' or 'uniform'"
            )
        if self.mode not in ("block", "sample"):
            raise ValueError(f"mode {self.mode!r} is not 'block' or 'sample'")
        if isinstance(self.drop_warmup, int | float) and not 0.0 <= self.drop_warmup <= 1.0:
            raise ValueError(
                f"drop_warmup as a number is a fraction of training in [0, 1], got "
                f"{self.drop_warmup}; give a duration like '500ba' otherwise"
            )


def _is_resnet_block(block: nn.Module) -> bool:
    names = ("conv1", "bn1", "conv2", "bn2", "relu")
    return all(isinstance(getattr(block, n, None), nn.Module) for n in names) and hasattr(
        block, "downsample"
    )


class StochasticBlock(nn.Module):
    """A residual block whose branch is dropped with probability ``drop_rate`` in training.

    ``drop_rate`` is the rate in force; ``final_drop_rate`` the one ``drop_warmup`` ramps to.
    """

    def __init__(self, block: nn.Module, drop_rate: float, mode: str = "block"):
        super().__init__()
        self.block, self.mode = block, mode
        self.drop_rate = self.final_drop_rate = float(drop_rate)
        self._resnet = _is_resnet_block(block)
        self._bottleneck = self._resnet and hasattr(block, "conv3") and hasattr(block, "bn3")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = 1.0 - self.drop_rate
        if self.training and self.mode == "block" and self.drop_rate > 0:
            if torch.rand(()).item() >= keep:  # a CPU draw: no device synchronisation
                return self._dropped(x)
            keep = 1.0  # kept branches are not rescaled in training (the paper's form)
        if self._resnet:
            return self._resnet_forward(x, keep)
        out = self.block(x)
        if out.shape != x.shape:
            raise ValueError(
                f"stochastic_depth: {type(self.block).__name__} maps shape {tuple(x.shape)} to "
                f"{tuple(out.shape)}; a block that is not a torchvision-style ResNet block is "
                "read as x + f(x) and must keep the shape. Narrow `target` to exclude it"
            )
        return out if keep == 1.0 else x + self._scale(out - x, keep)

    def _scale(self, branch: torch.Tensor, keep: float) -> torch.Tensor:
        if self.training:  # "sample" mode: each sample keeps its branch with probability keep
            shape = (branch.shape[0],) + (1,) * (branch.ndim - 1)
            mask = torch.rand(shape, dtype=branch.dtype, device=branch.device) < keep
            return branch * mask
        return branch * keep

    def _branch(self, x: torch.Tensor) -> torch.Tensor:
        b = self.block
        out = b.relu(b.bn1(b.conv1(x)))
        out = b.bn2(b.conv2(out))
        if self._bottleneck:
            out = b.bn3(b.conv3(b.relu(out)))
        return out

    def _shortcut(self, x: torch.Tensor) -> torch.Tensor:
        downsample = self.block.downsample
        return x if downsample is None else downsample(x)

    def _resnet_forward(self, x: torch.Tensor, keep: float) -> torch.Tensor:
        out = self._branch(x)
        if keep != 1.0:
            out = self._scale(out, keep)
        out = out + self._shortcut(x)
        return self.block.relu(out)

    def _dropped(self, x: torch.Tensor) -> torch.Tensor:
        if not self._resnet:
            return x
        # Out of place: the block's ReLU is in-place, and x may be needed by autograd.
        return torch.relu(self._shortcut(x))

    def extra_repr(self) -> str:
        return f"drop_rate={self.drop_rate:.4g}, mode={self.mode!r}"


def _matches(target: Target | list[Target], module: nn.Module) -> bool:
    if isinstance(target, list | tuple):
        return any(_matches(t, module) for t in target)
    if isinstance(target, str):
        cls = type(module)
        name = _ALIASES.get(target, target)
        return name in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}")
    return isinstance(module, target) if isinstance(target, type) else bool(target(module))


def _rate(cfg: StochasticDepthConfig, drop_rate: float, index: int, count: int) -> float:
    if cfg.drop_distribution == "linear":
        return drop_rate * (index + 1) / count
    return drop_rate


def apply_stochastic_depth(
    model: nn.Module,
    config: StochasticDepthConfig | None = None,
    /,
    *,
    optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
    **options: Any,
) -> dict[str, nn.Module]:
    """Wrap every ``target`` block of ``model`` in a `StochasticBlock`; returns them by name.

    Takes a `StochasticDepthConfig` or its fields as keyword arguments. The rates are the
    final ones; `StochasticDepth` applies ``drop_warmup``.
    """
    cfg = build_config(StochasticDepthConfig, config, options)
    target = cfg.target

    def selected(module: nn.Module) -> bool:
        # Applying twice must not wrap a block twice.
        return _matches(target, module) and not isinstance(module, StochasticBlock)

    count = sum(1 for m in model.modules() if selected(m))

    def wrap(block: nn.Module, index: int) -> nn.Module:
        return StochasticBlock(block, _rate(cfg, cfg.drop_rate, index, count), cfg.mode)

    return replace_modules(
        model, {selected: wrap}, optimizers=optimizers, method="stochastic_depth"
    )


def set_drop_scale(model: nn.Module, scale: float) -> None:
    """Set every `StochasticBlock`'s rate to ``scale`` times its final rate (for warm-up)."""
    for module in model.modules():
        if isinstance(module, StochasticBlock):
            module.drop_rate = module.final_drop_rate * scale


class StochasticDepth(ComposableAlgorithm, config=StochasticDepthConfig):
    """Wraps residual blocks at INIT and ramps their rates over ``drop_warmup`` (see
    `StochasticDepthConfig`)."""

    config: StochasticDepthConfig
    required_on_load = True
    required_events = (Event.INIT,)

    def __init__(self, config: StochasticDepthConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._warmup: float | None = None  # the warm-up as a fraction of training
        self._warming = self.config.drop_warmup not in (0, "0dur")

    match_events = frozenset({Event.INIT, Event.BATCH_START})

    def match(self, event: Event, state: State) -> bool:
        return event == Event.INIT or (event == Event.BATCH_START and self._warming)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        model = state.parallelism.unwrap(state.model)
        if event == Event.INIT:
            replaced = apply_stochastic_depth(model, self.config, optimizers=state.optimizers)
            logger.log_hyperparameters({"stochastic_depth/num_replaced": len(replaced)})
            return
        if self._warmup is None:
            warmup = self.config.drop_warmup
            number = isinstance(warmup, int | float)
            self._warmup = float(warmup) if number else as_fraction(warmup, state)
        progress = state.elapsed_fraction() / self._warmup if self._warmup > 0 else 1.0
        set_drop_scale(model, min(1.0, progress))
        if progress >= 1.0:
            self._warming = False  # the final rates are set; nothing more to do
