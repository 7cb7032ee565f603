"""MixUp (Zhang et al. 2018): train on convex combinations of pairs of samples.

Each microbatch's inputs become ``(1 - mixing) * x + mixing * x[perm]`` at BEFORE_FORWARD,
with ``mixing = min(z, 1 - z)``, ``z ~ Beta(alpha, alpha)`` (as Composer: the original
sample always weighs at least half, so training accuracy stays meaningful). The targets
are mixed the same way, as the paper does:

- ``interpolate_loss=False`` (default, as Composer): at BEFORE_LOSS the targets become
  ``(1 - mixing) * one_hot(y) + mixing * one_hot(y[perm])`` (classes along dim 1 of the
  outputs; targets already given as probabilities are mixed as they are), and the model's
  loss must accept probabilities as targets, as ``F.cross_entropy`` does. The original
  targets are put back at AFTER_LOSS, so metrics and other methods see them.
- ``interpolate_loss=True``: at AFTER_LOSS the loss becomes ``(1 - mixing) * loss(y) +
  mixing * loss(y[perm])``, with the model's own loss; for cross-entropy this is the same
  value, and it works with any loss (exactly the mixed-target loss only when the loss is
  linear in the targets).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainkit.algorithms._batch import Key, get_item, interpolate_loss, set_item
from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.algorithms._targets import mix_probabilities
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config, primary

__all__ = ["MixUp", "MixUpConfig", "mixup_batch"]


@dataclass(kw_only=True)
class MixUpConfig:
    alpha: float = primary(0.2)
    """``z ~ Beta(alpha, alpha)`` per microbatch, and ``mixing = min(z, 1 - z)``; positive."""
    interpolate_loss: bool = False
    """False: mix the targets (as one-hot probabilities); True: mix the two losses."""
    input_key: Key = 0
    """Where the batch keeps its inputs (a position or a dict key)."""
    target_key: Key = 1
    """Where the batch keeps its targets."""

    def __post_init__(self) -> None:
        if not self.alpha > 0:
            raise ValueError(f"alpha must be positive, got {self.alpha}")


def mixup_batch(
    x: torch.Tensor,
    y: torch.Tensor,
    config: MixUpConfig | None = None,
    /,
    *,
    mixing: float | None = None,
    indices: torch.Tensor | None = None,
    **options: Any,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Mix each sample with another of the batch.

    Returns ``(x_mixed, y_permuted, mixing)`` with ``x_mixed = (1 - mixing) * x +
    mixing * x[indices]`` and ``y_permuted = y[indices]``; train on the targets
    ``(1 - mixing) * y + mixing * y_permuted`` (as probabilities). ``mixing`` is
    ``min(z, 1 - z)`` with ``z ~ Beta(alpha, alpha)`` (``alpha`` from the `MixUpConfig` or
    keyword arguments) and ``indices`` is a random permutation, unless given.
    """
    alpha = build_config(MixUpConfig, config, options).alpha
    if mixing is None:
        z = float(torch.distributions.Beta(alpha, alpha).sample())
        mixing = min(z, 1.0 - z)
    if not 0.0 <= mixing <= 1.0:
        raise ValueError(f"mixing must be in [0, 1], got {mixing}")
    if indices is None:
        indices = torch.randperm(x.shape[0], device=x.device)
    if not x.is_floating_point():
        raise ValueError(
            f"mixup mixes float inputs, got {x.dtype} (token ids cannot be averaged; mix "
            "embeddings instead, or leave mixup out)"
        )
    x_mixed = torch.lerp(x, x[indices], mixing)
    return x_mixed, y[indices], mixing


class MixUp(ComposableAlgorithm, config=MixUpConfig):
    """Trains on mixed pairs of samples (see `MixUpConfig`)."""

    config: MixUpConfig
    mixes_targets = True

    def __init__(self, config: MixUpConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self.mixing = 0.0
        self.indices: torch.Tensor | None = None
        self.permuted_targets: Any = None
        self._original: Any = None

    match_events = frozenset({Event.BEFORE_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS})

    def match(self, event: Event, state: State) -> bool:
        if event == Event.BEFORE_FORWARD:
            return True
        if self.config.interpolate_loss:
            return event == Event.AFTER_LOSS
        return event in (Event.BEFORE_LOSS, Event.AFTER_LOSS)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        cfg = self.config
        if event == Event.BEFORE_FORWARD:
            x = get_item(state.batch, cfg.input_key, "mixup")
            y = get_item(state.batch, cfg.target_key, "mixup")
            self.indices = torch.randperm(x.shape[0], device=x.device)
            x_mixed, self.permuted_targets, self.mixing = mixup_batch(
                x, y, cfg, indices=self.indices
            )
            state.batch = set_item(state.batch, cfg.input_key, x_mixed)
        elif cfg.interpolate_loss:
            interpolate_loss(state, cfg.target_key, self.permuted_targets, self.mixing)
        elif event == Event.BEFORE_LOSS:
            self._original = get_item(state.batch, cfg.target_key, "mixup")
            mixed = mix_probabilities(
                state.outputs, self._original, self.permuted_targets, self.mixing, "mixup"
            )
            state.batch = set_item(state.batch, cfg.target_key, mixed)
        elif self._original is not None:
            state.batch = set_item(state.batch, cfg.target_key, self._original)
            self._original = None
