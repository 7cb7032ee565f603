"""Sharpness-aware minimization (Foret et al. 2021): step with the gradient at a nearby worse point.

The loop computes the gradient ``g`` at the weights ``w`` as usual. At AFTER_TRAIN_BATCH
(gradients ready, before the optimizer step) SAM moves to ``w + rho * g / ||g||``,
recomputes the loss and gradient there on the same microbatches, and moves back to ``w``;
the optimizer then steps from ``w`` with that second gradient. No optimizer wrapper is
needed, so any optimizer and scheduler works unchanged.

The perturbed pass replays the model's forward and ``loss`` on the microbatches as the
model saw them (after BEFORE_FORWARD transforms such as cutout or mixup's inputs), but
not the algorithms that change the loss itself (mixup/cutmix loss interpolation, label
smoothing): SAM warns when combined with them. It costs one more forward and backward
per step (every ``interval`` steps). AFTER_* events run the algorithm list in reverse, so
with ``algorithms=[GradientClipping(), SAM()]`` the SAM gradient is the one clipped.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config
from trainkit.core.loop import microbatch_weights

__all__ = ["SAM", "SAMConfig", "sam_gradient"]


@dataclass(kw_only=True)
class SAMConfig:
    rho: float = 0.05
    """Radius of the neighbourhood: the perturbation's L2 norm; positive."""
    epsilon: float = 1e-12
    """Added to the gradient norm to avoid dividing by zero; non-negative."""
    interval: int = 1
    """Take the SAM step every ``interval`` batches (plain steps in between); at least 1."""

    def __post_init__(self) -> None:
        if not self.rho > 0:
            raise ValueError(f"rho must be positive, got {self.rho}")
        if not self.epsilon >= 0:
            raise ValueError(f"epsilon must be non-negative, got {self.epsilon}")
        if (
            isinstance(self.interval, bool)
            or not isinstance(self.interval, int)
            or self.interval < 1
        ):
            raise ValueError(f"interval must be an int of at least 1, got {self.interval!r}")


def sam_gradient(
    model: nn.Module,
    loss_at: Any,
    config: SAMConfig | None = None,
    /,
    **options: Any,
) -> None:
    """Replace the gradients in ``model`` (already computed at its weights) by SAM's.

    ``loss_at()`` must run forward and backward at the model's current weights (it is
    called once, at the perturbed weights, with gradients cleared). The weights are
    restored exactly afterwards. ``rho`` and ``epsilon`` come from the `SAMConfig` or
    keyword arguments (``interval`` is the Algorithm's business).
    """
    cfg = build_config(SAMConfig, config, options)
    rho, epsilon = cfg.rho, cfg.epsilon
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        raise ValueError("SAM found no gradients: run backward before computing the SAM gradient")
    with torch.no_grad():
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        scale = rho / (norm + epsilon)
        saved = [p.detach().clone() for p in params]
        for param in params:
            param.add_(param.grad * scale.to(param.grad.dtype))
            param.grad = None
    try:
        loss_at()
    finally:
        with torch.no_grad():
            for param, original in zip(params, saved, strict=True):
                param.copy_(original)


class SAM(ComposableAlgorithm, config=SAMConfig):
    """Takes sharpness-aware steps (see `SAMConfig`)."""

    config: SAMConfig

    def __init__(self, config: SAMConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._microbatches: list[Any] = []

    def match(self, event: Event, state: State) -> bool:
        return event in (
            Event.FIT_START,
            Event.BEFORE_TRAIN_BATCH,
            Event.AFTER_FORWARD,
            Event.AFTER_TRAIN_BATCH,
        )

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.FIT_START:
            _check_run(state)
        elif event == Event.BEFORE_TRAIN_BATCH:
            self._microbatches = []
        elif event == Event.AFTER_FORWARD:
            self._microbatches.append(state.batch)
        elif (state.timestamp.batch + 1) % self.config.interval == 0:
            microbatches, self._microbatches = self._microbatches, []
            sam_gradient(
                state.parallelism.unwrap(state.model),
                lambda: _forward_backward(state, microbatches),
                self.config,
            )


def _check_run(state: State) -> None:
    if state.precision.scales_loss:
        raise ValueError(
            f"SAM does not support precision {state.precision.name!r} (it scales the loss, and "
            "its grad scaler may skip steps whose gradients SAM already used); use 'amp_bf16' "
            "or 'fp32'"
        )
    loss_methods = [
        type(a).__name__
        for a in state.algorithms
        if isinstance(a, ComposableAlgorithm) and a.mixes_targets
    ]
    if loss_methods:
        warnings.warn(
            f"SAM's perturbed pass recomputes the model's own loss, without what "
            f"{', '.join(loss_methods)} do to the loss or targets",
            stacklevel=2,
        )


def _forward_backward(state: State, microbatches: list[Any]) -> None:
    model, data = state.model, state.train_data
    unwrapped = state.parallelism.unwrap(model)
    assert data is not None
    weights = microbatch_weights(unwrapped, data, microbatches)
    last = len(microbatches) - 1
    for index, (microbatch, weight) in enumerate(zip(microbatches, weights, strict=True)):
        sync = contextlib.nullcontext() if index == last else state.parallelism.no_sync(model)
        with sync:
            with state.precision.autocast():
                loss = unwrapped.loss(model(microbatch), microbatch)
            (loss if weight is None else loss * weight).backward()
