"""`ActivationMonitor`: statistics of every module's inputs and outputs, now and then."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from trainkit.core import Callback, Logger, State, Time
from trainkit.loggers._common import batch_or_epoch_interval, starts_interval

__all__ = ["ActivationMonitor", "ActivationMonitorConfig", "activation_stats"]

_STATS = ("mean", "std", "max_abs", "l2_norm", "kurtosis")


@dataclass(kw_only=True)
class ActivationMonitorConfig:
    interval: str | int | Time = "25ba"
    """Which batches are measured: the first, then every ``interval`` (``"25ba"``), or the
    first batch of every ``interval`` epochs (``"1ep"``; an int counts epochs)."""
    stats: list[Literal["mean", "std", "max_abs", "l2_norm", "kurtosis"]] = field(
        default_factory=lambda: ["mean", "std", "max_abs"]
    )
    """What to log of each floating-point tensor: ``mean``, ``std`` (population),
    ``max_abs`` (largest magnitude), ``l2_norm`` and ``kurtosis`` (Composer's: over the
    last dimension, averaged over the others)."""
    ignore: list[str] = field(default_factory=list)
    """Modules to leave out: patterns (fnmatch) of module names (``"encoder.*"``) or class
    names (``"Dropout"``)."""
    inputs: bool = True
    """Also measure each module's inputs (not only its outputs)."""

    def __post_init__(self) -> None:
        batch_or_epoch_interval(self.interval, "ActivationMonitor")
        self.stats = list(self.stats)
        unknown = [s for s in self.stats if s not in _STATS]
        if unknown or not self.stats:
            raise ValueError(
                f"stats {self.stats!r} is not valid; choose from {', '.join(map(repr, _STATS))}"
            )
        if isinstance(self.ignore, str):
            raise ValueError(f"ignore {self.ignore!r} is not valid; give a list of patterns")
        self.ignore = list(self.ignore)


def activation_stats(value: torch.Tensor, stats: Sequence[str]) -> dict[str, torch.Tensor]:
    """The chosen statistics of ``value`` as 0-d float32 tensors on its device (no sync)."""
    x = value.detach().float()
    out: dict[str, torch.Tensor] = {}
    if "mean" in stats:
        out["mean"] = x.mean()
    if "std" in stats:
        out["std"] = x.std(correction=0)
    if "max_abs" in stats:
        out["max_abs"] = x.abs().max()
    rows = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    if "l2_norm" in stats:
        out["l2_norm"] = torch.linalg.vector_norm(rows, dim=-1).mean()
    if "kurtosis" in stats:
        centred = rows - rows.mean(dim=-1, keepdim=True)
        variance = centred.pow(2).mean(dim=-1)
        out["kurtosis"] = (centred.pow(4).mean(dim=-1) / variance.pow(2)).mean()
    return out


class ActivationMonitor(Callback, config=ActivationMonitorConfig):
    """Logs statistics of every module's inputs and outputs on chosen training batches.

    On a chosen batch (see ``interval``), forward hooks are put on every module of the
    model for the first microbatch's forward pass and removed right after it; each
    floating-point tensor going in or out gives ``activations/<stat>/<module>/<input|output>.<i>``
    (``input.<keyword>`` for keyword arguments, ``output.logits`` for a dict output,
    ``output.0.1`` for nested tuples; the model itself is named ``model``), logged at the batch's number (the step its loss is
    logged at). Values stay on the device until a destination writes them: no sync.

    Composer's ``average`` is ``mean`` here; its ``l2_norm`` and ``kurtosis`` are
    available; its ``max`` (each row's largest value, averaged) is replaced by
    ``max_abs``. Every destination receives the values (Composer sends them to wandb only
    by default). Options: `ActivationMonitorConfig`.
    """

    config: ActivationMonitorConfig

    def __init__(self, config: ActivationMonitorConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._every = batch_or_epoch_interval(self.config.interval, "ActivationMonitor")
        self._handles: list[Any] = []
        self._metrics: dict[str, torch.Tensor] = {}
        self._last_batch: int | None = None

    def before_forward(self, state: State, logger: Logger) -> None:
        batch = state.timestamp.batch
        if batch == self._last_batch or not starts_interval(self._every, state):
            return  # a later microbatch of a measured batch, or not a measured batch
        self._last_batch = batch
        model = state.parallelism.unwrap(state.model)
        for name, module in model.named_modules():
            if not self._ignored(name, module):
                hook = self._hook(name or "model")
                self._handles.append(module.register_forward_hook(hook, with_kwargs=True))

    def after_forward(self, state: State, logger: Logger) -> None:
        if not self._handles:
            return
        self._remove_hooks()
        metrics, self._metrics = self._metrics, {}
        if metrics:
            logger.log_metrics(metrics, step=state.timestamp.batch + 1)

    def close(self, state: State | None = None, logger: Logger | None = None) -> None:
        self._remove_hooks()

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _ignored(self, name: str, module: nn.Module) -> bool:
        cls = type(module).__name__
        return any(
            fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(cls, p) for p in self.config.ignore
        )

    def _hook(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            with torch.no_grad():
                if self.config.inputs:
                    self._add(f"{name}/input", args)
                    self._add(f"{name}/input", kwargs)
                wrapped = output if isinstance(output, tuple | Mapping) else (output,)
                self._add(f"{name}/output", wrapped)

        return hook

    def _add(self, prefix: str, values: Any) -> None:
        items = values.items() if isinstance(values, Mapping) else enumerate(values)
        for key, value in items:
            where = f"{prefix}.{key}"
            if isinstance(value, torch.Tensor):
                if value.is_floating_point() and value.numel() > 0:
                    for stat, number in activation_stats(value, self.config.stats).items():
                        self._metrics[f"activations/{stat}/{where}"] = number
            elif isinstance(value, Mapping | list | tuple):
                self._add(where, value)
