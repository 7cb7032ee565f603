"""Gradient clipping by global norm, by value, or adaptive (AGC, Brock et al. 2021).

Runs at AFTER_TRAIN_BATCH: all microbatches' gradients are in, the step has not happened.
When the precision scales the loss (fp16) the gradients are unscaled first, so the
threshold means what it says.
Correct under FSDP2: the global norm of DTensor gradients is reduced over the mesh by
`clip_grad_norm_`; value clipping is elementwise; adaptive clipping uses per-row norms,
and FSDP2 shards parameters by rows (dim 0), so every row is whole on one rank. Under
pipeline parallel (a strategy that `runs_forward_backward`) each rank holds one stage's
gradients: "value" and "adaptive" stay exact, "norm" is refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary

__all__ = ["GradientClipping", "GradientClippingConfig", "apply_gradient_clipping"]

ClippingType = Literal["norm", "value", "adaptive"]


@dataclass(kw_only=True)
class GradientClippingConfig:
    clipping_type: ClippingType = primary("norm")
    """"norm": scale all gradients so their global L2 norm is at most the threshold;
    "value": clamp each element to [-threshold, threshold]; "adaptive": clip each row's
    gradient to threshold times that row's weight norm."""
    clipping_threshold: float = 1.0
    """The norm, value, or ratio (adaptive) not to exceed; positive."""

    def __post_init__(self) -> None:
        if self.clipping_type not in ("norm", "value", "adaptive"):
            raise ValueError(
                f"clipping_type {self.clipping_type!r} is not one of 'norm', 'value', 'adaptive'"
            )
        if not self.clipping_threshold > 0:
            raise ValueError(f"clipping_threshold must be positive, got {self.clipping_threshold}")


def apply_gradient_clipping(
    parameters: nn.Module | Iterable[nn.Parameter],
    config: GradientClippingConfig | None = None,
    /,
    **options: Any,
) -> torch.Tensor | None:
    """Clip the gradients of ``parameters`` in place; returns the pre-clip norm for "norm".

    Takes a `GradientClippingConfig` or its fields as keyword arguments.
    """
    cfg = build_config(GradientClippingConfig, config, options)
    params = list(parameters.parameters() if isinstance(parameters, nn.Module) else parameters)
    with_grad = [p for p in params if p.grad is not None]
    if cfg.clipping_type == "norm":
        return torch.nn.utils.clip_grad_norm_(with_grad, cfg.clipping_threshold)
    if cfg.clipping_type == "value":
        torch.nn.utils.clip_grad_value_(with_grad, cfg.clipping_threshold)
        return None
    for param in with_grad:
        _adaptive_clip(param, cfg.clipping_threshold)
    return None


@torch.no_grad()
def _adaptive_clip(param: nn.Parameter, ratio: float, eps: float = 1e-3) -> None:
    weight, grad = param.detach(), param.grad
    dims = tuple(range(1, weight.ndim)) if weight.ndim > 1 else None
    weight_norm = weight.norm(dim=dims, keepdim=True) if dims else weight.norm()
    grad_norm = grad.norm(dim=dims, keepdim=True) if dims else grad.norm()
    max_norm = weight_norm.clamp(min=eps) * ratio
    scale = (max_norm / grad_norm.clamp(min=1e-6)).clamp(max=1.0)
    grad.mul_(scale)


class GradientClipping(ComposableAlgorithm, config=GradientClippingConfig):
    """Clips gradients before every optimizer step (see `GradientClippingConfig`)."""

    config: GradientClippingConfig
    required_events = (Event.AFTER_TRAIN_BATCH,)

    def __init__(self, config: GradientClippingConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)

    match_events = frozenset({Event.AFTER_TRAIN_BATCH})

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if self.config.clipping_type == "norm" and state.parallelism.runs_forward_backward:
            raise ValueError(
                f"GradientClipping(clipping_type='norm') cannot run under "
                f"{type(state.parallelism).__name__}: each rank holds only its pipeline "
                "stage's gradients, so it would clip each stage by its own norm, not the "
                "global one. Use clipping_type='value' or 'adaptive' (exact per stage)"
            )
        for optimizer in state.optimizers:
            state.precision.unscale_gradients(optimizer)
        apply_gradient_clipping(state.model, self.config)
