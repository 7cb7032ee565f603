"""Sharpness-aware minimization (Foret et al. 2021): step with the gradient at a nearby worse point.

The loop computes the gradient ``g`` at the weights ``w`` as usual. At AFTER_TRAIN_BATCH
(all gradients in, before the optimizer step) SAM moves to ``w + rho * g / (||g|| +
epsilon)``, replays the whole step there and moves back to ``w``; the optimizer then
steps from ``w`` with the replayed gradient. No optimizer wrapper is needed, so any
optimizer and scheduler works unchanged.

The replay is the step itself, as Composer's closure is: the loop's `State.replay_step`, with
BEFORE_TRAIN_BATCH, every microbatch's forward, loss and backward events and
AFTER_TRAIN_BATCH fired for the other algorithms (and the callbacks), so what they do to
the inputs, targets, loss and gradients (mixup, cutmix, label smoothing, gradient
clipping, ...) is in the second gradient too. SAM runs first (``order = "first"``), so at
AFTER_TRAIN_BATCH, where events run in reverse, it runs last: every other method has
handled the first gradient before SAM uses it, and handles the second inside the replay.
The replay's loss does not replace the step's loss, and train metrics are not counted
twice.

With ``amp_fp16`` the gradients may still be scaled when SAM reads them: the direction
``g / ||g||`` does not depend on the scale (``epsilon`` is negligible beside ``||g||``).
A first gradient with inf/NaN skips the SAM step (the grad scaler then skips the optimizer
step and lowers its scale, as Composer's closure scaler does); otherwise the precision's
per-step records are reset (`Precision.reset_after_oom`) before the replay, so the
scaler unscales and checks the second gradient, which is the one stepped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary
from trainkit.core.rng import get_rng_state, set_rng_state

__all__ = ["SAM", "SAMConfig", "sam_gradient"]


@dataclass(kw_only=True)
class SAMConfig:
    rho: float = primary(0.05)
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
    loss_at: Callable[[], Any],
    config: SAMConfig | None = None,
    /,
    *,
    skip_non_finite: bool = False,
    **options: Any,
) -> bool:
    """Replace the gradients in ``model`` (already computed at its weights) by SAM's.

    ``loss_at()`` must run forward and backward at the model's current weights (it is
    called once, at the perturbed weights, with gradients cleared). The weights are
    restored exactly afterwards. ``rho`` and ``epsilon`` come from the `SAMConfig` or
    keyword arguments (``interval`` is the Algorithm's business). With
    ``skip_non_finite``, a gradient whose norm is inf or NaN (an fp16 overflow) is left as
    it is and False is returned (this reads the norm on the host); otherwise True.
    """
    cfg = build_config(SAMConfig, config, options)
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        raise ValueError("SAM found no gradients: run backward before computing the SAM gradient")
    with torch.no_grad():
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if skip_non_finite and not bool(torch.isfinite(norm)):
            return False
        scale = cfg.rho / (norm + cfg.epsilon)
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
    return True


class SAM(ComposableAlgorithm, config=SAMConfig):
    """Takes sharpness-aware steps (see `SAMConfig`).

    Differences from Composer: the replay draws the same random numbers as the first pass
    (the RNG state is restored for it), so mixup's pair and weight, dropout masks, ... are
    those the first gradient was taken with, and the SAM objective is the same minibatch loss;
    batch-norm statistics (and other buffers) are put back after the replay, so the perturbed
    pass leaves no trace but its gradient; with several ranks, the ascent uses the all-reduced
    first gradient (Composer and the paper's m-sharpness use each rank's own).
    """

    config: SAMConfig
    order = "first"  # so that it runs last at AFTER_TRAIN_BATCH (AFTER_* events reverse)
    required_events = (Event.BEFORE_TRAIN_BATCH, Event.AFTER_TRAIN_BATCH)

    def __init__(self, config: SAMConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._rng: dict[str, Any] | None = None
        self._replaying = False

    match_events = frozenset({Event.BEFORE_TRAIN_BATCH, Event.AFTER_TRAIN_BATCH})

    def match(self, event: Event, state: State) -> bool:
        if self._replaying:
            return False
        return event in (Event.BEFORE_TRAIN_BATCH, Event.AFTER_TRAIN_BATCH) and (
            (state.timestamp.batch + 1) % self.config.interval == 0
        )

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.BEFORE_TRAIN_BATCH:
            self._rng = get_rng_state()  # before any method draws for this step
            return
        assert self._rng is not None, "SAM needs BEFORE_TRAIN_BATCH before AFTER_TRAIN_BATCH"
        model = state.parallelism.unwrap(state.model)
        sam_gradient(
            model,
            lambda: self._replay(state, logger, model),
            self.config,
            skip_non_finite=state.precision.scales_loss,
        )

    def _replay(self, state: State, logger: Logger, model: nn.Module) -> None:
        if state.replay_step is None:
            raise ValueError(
                "SAM replays the step through state.replay_step, which this loop does not "
                "set; run it in trainkit-trainer's loop (prepare_run sets it), or set "
                "state.replay_step to a function that runs the batch's forward and backward"
            )
        kept = (state.total_loss, state.rank_loss, state.outputs, state.loss, state.train_metrics)
        buffers = [(b, b.detach().clone()) for b in model.buffers()]
        if state.precision.scales_loss:
            state.precision.reset_after_oom()  # forget the first gradient's unscaling
        set_rng_state(self._rng)
        state.train_metrics = {}
        self._replaying = True
        try:
            state.replay_step()
        finally:
            self._replaying = False
            state.total_loss, state.rank_loss, state.outputs, state.loss, state.train_metrics = kept
            with torch.no_grad():
                for buffer, value in buffers:
                    buffer.copy_(value)
