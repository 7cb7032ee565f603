"""Warmup-stable-decay: warm up, hold the peak, then decay over the run's last stretch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from trainkit.core import Time, ensure_time
from trainkit.core.config import Configurable, primary
from trainkit.trainer._schedule_time import _check_alpha, _check_warmup, _position

if TYPE_CHECKING:
    from trainkit.core import State

_SHAPES = ("linear", "1-sqrt")


@dataclass(kw_only=True)
class WarmupStableDecaySchedulerConfig:
    """Options of `WarmupStableDecayScheduler`."""

    t_warmup: Time | str | int = primary()
    """How long the linear warm-up from 0 to 1 takes (``"0.05dur"``, ``"100ba"``, ...)."""
    t_decay: Time | str | int = "0.2dur"
    """How long the final decay to ``alpha_f`` takes, ending at ``t_max`` (a fifth of the
    run by default, the cool-down length Hägele et al. (2024) found to match cosine); it
    must fit in ``t_max`` after the warm-up."""
    t_max: Time | str | int = "1dur"
    """When the decay reaches ``alpha_f`` (counted from the start); ``alpha_f`` holds after."""
    alpha_f: float = 0.0
    """The multiplier at ``t_max`` and after."""
    decay_shape: Literal["linear", "1-sqrt"] = "linear"
    """The decay's shape: ``"linear"`` (MiniCPM's WSD) or ``"1-sqrt"``, ``1 - sqrt(progress)``
    (Hägele et al. 2024, which they found better than linear)."""
    scale_warmup: bool = False
    """Whether ``scale_schedule_ratio`` also scales ``t_warmup`` (``t_decay`` and ``t_max``
    are always scaled, as other schedules' lengths are)."""

    def __post_init__(self) -> None:
        _check_warmup(self.t_warmup, self.scale_warmup)
        ensure_time(self.t_decay, "t_decay")
        ensure_time(self.t_max, "t_max")
        _check_alpha("alpha_f", self.alpha_f)
        if self.decay_shape not in _SHAPES:
            raise ValueError(
                f"decay_shape must be one of {', '.join(map(repr, _SHAPES))}, "
                f"got {self.decay_shape!r}"
            )


class WarmupStableDecayScheduler(Configurable, config=WarmupStableDecaySchedulerConfig):
    """Warm up linearly to 1 over ``t_warmup``, hold 1, then decay to ``alpha_f`` over the
    last ``t_decay`` before ``t_max`` (linear or ``1 - sqrt``).

    The schedule of MiniCPM (Hu et al. 2024, "warmup-stable-decay") and of Hägele et al.
    2024 ("Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations"):
    the stable phase can be continued from a checkpoint and decayed at any length.
    """

    config: WarmupStableDecaySchedulerConfig

    def __init__(self, config: WarmupStableDecaySchedulerConfig | None = None, /, **options: Any):
        super().__init__(config, **options)
        c = self.config
        self.t_warmup = ensure_time(c.t_warmup, "t_warmup")
        self.t_decay = ensure_time(c.t_decay, "t_decay")
        self.t_max = ensure_time(c.t_max, "t_max")

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        c = self.config
        elapsed, warmup, measure = _position(self.t_warmup, state, ssr if c.scale_warmup else 1.0)
        _, decay, decay_measure = _position(self.t_decay, state, ssr)
        _, total, total_measure = _position(self.t_max, state, ssr)
        if not measure == decay_measure == total_measure:
            raise ValueError(
                f"t_warmup {self.t_warmup}, t_decay {self.t_decay} and t_max {self.t_max} are "
                f"measured differently ({measure}, {decay_measure}, {total_measure}) in a run "
                f"of {state.max_duration}; give them in the same unit"
            )
        if warmup + decay > total + 1e-9:
            raise ValueError(
                f"t_warmup {self.t_warmup} plus t_decay {self.t_decay} is longer than t_max "
                f"{self.t_max}; shorten one, e.g. t_warmup='0.05dur', t_decay='0.2dur'"
            )
        if elapsed < warmup:
            return elapsed / warmup
        start = total - decay
        if elapsed < start:
            return 1.0
        progress = min((elapsed - start) / decay, 1.0) if decay > 0 else 1.0
        shape = progress if c.decay_shape == "linear" else math.sqrt(progress)
        return c.alpha_f + (1.0 - c.alpha_f) * (1.0 - shape)
