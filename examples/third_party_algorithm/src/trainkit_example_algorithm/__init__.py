"""Gaussian noise on the training inputs: an example of a third-party trainkit algorithm.

The same shape as trainkit's own methods: a config dataclass, a pure function usable
without a Trainer, and a thin class with ``match`` / ``apply`` (the `Algorithm`
protocol; no base class needed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainkit.core import Event, Logger, State

__all__ = ["InputNoise", "InputNoiseConfig", "add_input_noise"]


@dataclass(kw_only=True)
class InputNoiseConfig:
    std: float = 0.1
    """Standard deviation of the noise added to every input element; positive."""

    def __post_init__(self) -> None:
        if not self.std > 0:
            raise ValueError(f"std must be positive, got {self.std}")


def add_input_noise(x: torch.Tensor, *, std: float = 0.1) -> torch.Tensor:
    """``x + N(0, std^2)`` elementwise (a new tensor)."""
    InputNoiseConfig(std=std)
    return x + torch.randn_like(x) * std


class InputNoise:
    """Adds Gaussian noise to the inputs of every training microbatch (batches ``(x, y)``)."""

    def __init__(self, std: float = 0.1):
        self.config = InputNoiseConfig(std=std)

    def match(self, event: Event, state: State) -> bool:
        return event == Event.BEFORE_FORWARD

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        x, *rest = state.batch
        state.batch = (add_input_noise(x, std=self.config.std), *rest)
