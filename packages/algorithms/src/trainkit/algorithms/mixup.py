"""MixUp (Zhang et al. 2018): train on convex combinations of pairs of samples.

Each microbatch's inputs become ``(1 - mixing) * x + mixing * x[perm]`` at BEFORE_FORWARD,
and at AFTER_LOSS the loss becomes ``(1 - mixing) * loss(y) + mixing * loss(y[perm])``
with the model's own loss: for cross-entropy, exactly the loss against the mixed one-hot
targets, and it works with any loss the model defines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainkit.algorithms._batch import Key, get_item, interpolate_loss, set_item
from trainkit.algorithms._passes import ComposableAlgorithm
from trainkit.core import Event, Logger, State
from trainkit.core.config import build_config

__all__ = ["MixUp", "MixUpConfig", "mixup_batch"]


@dataclass(kw_only=True)
class MixUpConfig:
    alpha: float = 0.2
    """The mixing weight is drawn from Beta(alpha, alpha) per microbatch; positive."""
    interpolate_loss: bool = True
    """Mix the loss with the permuted targets' loss; False mixes only the inputs."""
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
    mixing * x[indices]`` and ``y_permuted = y[indices]``; train on ``(1 - mixing) *
    loss(y) + mixing * loss(y_permuted)``. ``mixing`` is drawn from Beta(alpha, alpha)
    (``alpha`` from the `MixUpConfig` or keyword arguments) and ``indices`` is a random
    permutation unless given.
    """
    alpha = build_config(MixUpConfig, config, options).alpha
    if mixing is None:
        mixing = float(torch.distributions.Beta(alpha, alpha).sample())
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

    def match(self, event: Event, state: State) -> bool:
        return event == Event.BEFORE_FORWARD or (
            event == Event.AFTER_LOSS and self.config.interpolate_loss
        )

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
            return
        interpolate_loss(state, cfg.target_key, self.permuted_targets, self.mixing)
