"""Reading the metric a training-control callback watches, and which direction is better."""

from __future__ import annotations

from typing import Literal

from trainkit.core import State

__all__ = ["Mode", "check_mode", "check_monitor", "improves", "read_metric"]

Mode = Literal["max", "min"]

_LOWER_IS_BETTER = ("loss", "entropy", "perplexity", "error", "mse", "mae")


# Composer's ``comp`` strings mean the same directions.
_ALIASES: dict[str, Mode] = {
    "max": "max",
    "gt": "max",
    "greater": "max",
    "min": "min",
    "lt": "min",
    "less": "min",
}


def check_mode(monitor: str, mode: str | None) -> Mode:
    """``mode`` as given (Composer's ``comp`` strings "gt"/"greater", "lt"/"less" accepted),
    or inferred: "min" for losses, errors and perplexities, else "max"."""
    if mode is None:
        return "min" if any(word in monitor.lower() for word in _LOWER_IS_BETTER) else "max"
    if not isinstance(mode, str) or mode.lower() not in _ALIASES:
        raise ValueError(
            f"mode {mode!r} is not one of 'max', 'min' (Composer's 'gt', 'greater', 'lt', "
            "'less' also work), or None to infer it; a comparison function is not accepted"
        )
    return _ALIASES[mode.lower()]


def check_monitor(state: State, label: str, monitor: str, who: str) -> None:
    """Raise before training when the metric does not exist in this run."""
    if label == "train":
        available = sorted(state.train_metrics)
    elif label in state.eval_metrics:
        available = sorted(state.eval_metrics[label])
    else:
        raise ValueError(
            f"{who} watches dataloader_label {label!r}, which this run does not have; "
            f"available: 'train', {', '.join(map(repr, sorted(state.eval_metrics))) or 'no eval data'}"
        )
    if monitor not in available:
        raise ValueError(
            f"{who} watches metric {monitor!r}, which {label!r} does not compute; available: "
            f"{', '.join(available) or 'none'}"
        )


def read_metric(state: State, label: str, monitor: str) -> float:
    metrics = state.train_metrics if label == "train" else state.eval_metrics[label]
    return float(metrics[monitor].compute())


def improves(value: float, best: float | None, mode: Mode, min_delta: float = 0.0) -> bool:
    if best is None:
        return True
    return value > best + min_delta if mode == "max" else value < best - min_delta
