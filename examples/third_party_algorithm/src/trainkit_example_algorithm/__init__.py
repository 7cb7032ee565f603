"""Gaussian noise on the training inputs: an example of a third-party trainkit algorithm.

The same shape as trainkit's own methods:

- one config dataclass, ``@dataclass(kw_only=True)``, with a docstring under every field
  (they become the ``trainkit train --print-config`` comments and the docs) and the
  validation in ``__post_init__``;
- a pure function usable without a Trainer, taking that config or its fields as keyword
  arguments (`trainkit.core.config.build_config`);
- a thin class: it subclasses `trainkit.core.Algorithm`, names its config with
  ``config=InputNoiseConfig``, and defines ``match`` / ``apply``.

``InputNoise(InputNoiseConfig(std=0.5))`` and ``InputNoise(std=0.5)`` build the same
method, and a run config sets it with ``{name: example_input_noise, std: 0.5}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainkit.core import Algorithm, Event, Logger, State
from trainkit.core.config import build_config

__all__ = ["InputNoise", "InputNoiseConfig", "add_input_noise"]


@dataclass(kw_only=True)
class InputNoiseConfig:
    std: float = 0.1
    """Standard deviation of the noise added to every input element; positive."""

    def __post_init__(self) -> None:
        if not self.std > 0:
            raise ValueError(f"std must be positive, got {self.std}")


def add_input_noise(
    x: torch.Tensor, config: InputNoiseConfig | None = None, /, **options: Any
) -> torch.Tensor:
    """``x + N(0, std^2)`` elementwise (a new tensor); ``std`` from the config or a keyword."""
    std = build_config(InputNoiseConfig, config, options).std
    return x + torch.randn_like(x) * std


class InputNoise(Algorithm, config=InputNoiseConfig):
    """Adds Gaussian noise to the inputs of every training microbatch (batches ``(x, y)``).

    What else the base class declares, with its default: ``order`` (``"first"``,
    ``"default"`` or ``"last"`` among the methods that run at an event),
    ``required_events`` (the events a hand-written loop must fire for it to work),
    ``required_on_load`` (True for methods that change the model's structure: a
    checkpoint saved with it then needs it to load), ``state_dict`` / ``load_state_dict``
    (state that must survive a resume).
    """

    config: InputNoiseConfig
    required_events = (Event.BEFORE_FORWARD,)
    match_events = frozenset({Event.BEFORE_FORWARD})  # match is asked at these events only

    def __init__(self, config: InputNoiseConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)  # builds and validates self.config

    def match(self, event: Event, state: State) -> bool:
        return event == Event.BEFORE_FORWARD

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        x, *rest = state.batch
        state.batch = (add_input_noise(x, self.config), *rest)
