"""Shared by the destinations: buffering logged values until they are written, paths,
flattening nested hyperparameters, and checking intervals."""

from __future__ import annotations

import importlib
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from trainkit.core import (
    Callback,
    Logger,
    LoggerDestination,
    State,
    Time,
    TimeUnit,
    dist,
    ensure_time,
)
from trainkit.core.interval import interval_trigger
from trainkit.core.messages import warn

__all__ = [
    "BufferedDestination",
    "BufferedDestinationConfig",
    "MetricBuffer",
    "Record",
    "batch_or_epoch_interval",
    "check_flush_interval",
    "check_interval",
    "flatten",
    "import_extra",
    "numeric",
    "path_text",
    "resolve_folder",
    "starts_interval",
    "to_python",
]

Record = tuple[int, float, dict[str, Any]]
"""(step, unix time when logged, metrics)."""


def import_extra(module: str, extra: str) -> ModuleType:
    """Import an optional client, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{module} is not installed, and this logger needs it; install it with "
            f'pip install "trainkit-loggers[{extra}]"'
        ) from err


def check_interval(value: str | int | Time) -> None:
    """Raise ValueError unless ``value`` is a duration such as ``"100ba"`` or ``"1ep"``."""
    interval_trigger(value)  # parses it, as the component does when it is built


def batch_or_epoch_interval(value: str | int | Time, owner: str) -> Time:
    """``value`` as a `Time` in batches or epochs (an int counts epochs), else ValueError."""
    every = ensure_time(value, "interval")
    if every.unit not in (TimeUnit.BATCH, TimeUnit.EPOCH) or every.value < 1:
        raise ValueError(
            f"{owner} interval {value!r} is not valid; use a number of batches or epochs, "
            "e.g. '25ba' or '1ep'"
        )
    return every


def starts_interval(every: Time, state: State) -> bool:
    """Whether the training batch about to run starts an ``every`` interval: the first
    batch, then every ``every`` batches (or the first batch of every ``every`` epochs)."""
    ts = state.timestamp
    if every.unit == TimeUnit.EPOCH:
        return ts.batch_in_epoch == 0 and ts.epoch % int(every.value) == 0
    return ts.batch % int(every.value) == 0


def check_flush_interval(flush_interval: float) -> None:
    if isinstance(flush_interval, bool) or not (
        isinstance(flush_interval, int | float) and flush_interval >= 0
    ):
        raise ValueError(
            f"flush_interval {flush_interval!r} is not valid; use seconds >= 0 "
            "(0 writes at every call)"
        )


def path_text(value: str | os.PathLike[str]) -> str:
    """A folder or file given as a `Path` kept as its text (plain data, as a config file gives)."""
    return os.fspath(value)


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts and lists as one level of dotted keys with plain values.

    ``{"algorithms": [{"name": "EMA", "half_life": "1000ba"}]}`` becomes
    ``{"algorithms.0.name": "EMA", "algorithms.0.half_life": "1000ba"}`` (what
    TensorBoard's and MLflow's flat parameters need). An empty dict or list stays as it
    is, so its key is not lost.
    """
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, list | tuple) and value:
            flat.update(flatten({str(i): item for i, item in enumerate(value)}, f"{name}."))
        else:
            flat[name] = value
    return flat


def resolve_folder(folder: str | Path, state: State | None) -> Path:
    """Fill ``{run_name}`` and ``{rank}`` in a folder template."""
    run_name = state.run_name if state is not None else "run"
    rank = state.rank if state is not None else dist.get_rank()
    try:
        return Path(str(folder).format(run_name=run_name, rank=rank))
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(
            f"folder {str(folder)!r} is not a valid template ({err!r}); it may contain "
            "'{run_name}' and '{rank}', e.g. 'runs/{run_name}'"
        ) from err


def to_python(records: list[Record]) -> list[Record]:
    """The records with every tensor value turned into a Python number (or list).

    Scalars on an accelerator are stacked per device and copied in one transfer, so
    writing many buffered values waits for the device once, not once per value.
    """
    pending: dict[torch.device, list[tuple[dict[str, Any], str, torch.Tensor]]] = {}
    out: list[Record] = []
    for step, when, metrics in records:
        values: dict[str, Any] = {}
        for key, value in metrics.items():
            if isinstance(value, torch.Tensor):
                if value.device.type != "cpu" and value.numel() == 1:
                    pending.setdefault(value.device, []).append((values, key, value))
                    values[key] = None  # keeps the key order; filled below
                else:
                    values[key] = value.detach().tolist()
            elif hasattr(value, "item") and callable(value.item):  # numpy scalars
                values[key] = value.item()
            else:
                values[key] = value
        out.append((step, when, values))
    for device, entries in pending.items():
        dtype = torch.float32 if device.type == "mps" else torch.float64
        stacked = torch.stack([t.detach().reshape(()).to(dtype) for _, _, t in entries])
        for (values, key, tensor), number in zip(entries, stacked.tolist(), strict=True):
            is_float = tensor.is_floating_point() or tensor.is_complex()
            values[key] = number if is_float or not math.isfinite(number) else int(number)
    return out


class MetricBuffer:
    """Holds logged metrics until they are written, so logging never waits for the device.

    `add` keeps references (tensors stay on their device, unconverted) and says when the
    buffer is due for writing: every ``flush_interval`` seconds, or at ``max_records``.
    `drain` converts everything at once and empties the buffer.
    """

    def __init__(self, flush_interval: float, max_records: int = 10_000):
        check_flush_interval(flush_interval)
        self.flush_interval = flush_interval
        self.max_records = max_records
        self._records: list[Record] = []
        self._last_flush = time.time()

    def __len__(self) -> int:
        return len(self._records)

    def add(self, metrics: Mapping[str, Any], step: int) -> bool:
        """Buffer ``metrics`` logged at ``step``; returns whether it is time to write."""
        now = time.time()
        self._records.append((step, now, dict(metrics)))
        return (
            now - self._last_flush >= self.flush_interval or len(self._records) >= self.max_records
        )

    def drain(self) -> list[Record]:
        """Every buffered record, converted to Python values, oldest first."""
        records, self._records = self._records, []
        self._last_flush = time.time()
        return to_python(records)


def numeric(value: Any) -> float | None:
    """``value`` as a float when it is a real number (bools and lists are not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


@dataclass(kw_only=True)
class BufferedDestinationConfig:
    """What every buffered destination (file, wandb, TensorBoard, MLflow) is built with."""

    flush_interval: float = 5.0
    """Seconds between writes (0: write at every call). Values are also written at the
    end of `fit` and on `close`."""
    rank_zero_only: bool = True
    """Only rank 0 writes (the other ranks do nothing)."""

    def __post_init__(self) -> None:
        check_flush_interval(self.flush_interval)


class BufferedDestination(Callback, LoggerDestination, config=BufferedDestinationConfig):
    """Base of the destinations that write in batches: file, wandb, TensorBoard, MLflow.

    Subclasses implement `_start` (open the file or remote run; called at `Event.INIT`, so
    a bad destination fails before training, or at the first write outside a Trainer),
    `_write` (records already converted to Python values), `_write_hyperparameters` and
    `_finish`. Hyperparameters logged before the start (outside a Trainer, before the
    first write) are kept and written once the run has started. Only rank 0
    writes unless ``rank_zero_only`` is False. Errors while writing propagate to the
    `Logger`, which reports the first one and keeps training; the flush at the end of
    `fit` runs as a callback, so it warns instead of raising. A subclass's config extends
    `BufferedDestinationConfig`.
    """

    config: BufferedDestinationConfig

    def __init__(self, config: BufferedDestinationConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._buffer = MetricBuffer(self.config.flush_interval)
        self._state: State | None = None
        self._started = False
        self._warned = False
        self._writes: bool | None = None
        self._pending_hyperparameters: dict[str, Any] = {}

    def _start(self, state: State | None) -> None:
        raise NotImplementedError

    def _write_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        raise NotImplementedError

    def _write(self, records: list[Record]) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        raise NotImplementedError

    def _enabled(self) -> bool:
        if self._writes is None:  # asked once: the rank does not change
            self._writes = not self.config.rank_zero_only or dist.get_rank() == 0
        return self._writes

    def _ensure_started(self) -> None:
        if not self._started:
            self._start(self._state)
            self._started = True
            if self._pending_hyperparameters:
                pending, self._pending_hyperparameters = self._pending_hyperparameters, {}
                self._write_hyperparameters(pending)

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        if not self._enabled():
            return
        if not self._started:  # no run yet: written when it starts
            self._pending_hyperparameters.update(hyperparameters)
            return
        self.flush()  # keep the order of what was logged
        self._write_hyperparameters(dict(hyperparameters))

    def init(self, state: State, logger: Logger) -> None:
        self._state = state
        if self._enabled():
            self._ensure_started()

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        if self._enabled() and self._buffer.add(metrics, step):
            self.flush()

    def flush(self) -> None:
        """Write everything logged so far."""
        if len(self._buffer):
            self._ensure_started()
            self._write(self._buffer.drain())

    def fit_end(self, state: State, logger: Logger) -> None:
        try:
            self.flush()
        except Exception as err:
            if not self._warned:
                self._warned = True
                warn(
                    f"logger destination {type(self).__name__} could not write at the end of "
                    f"fit ({err!r}); training is not affected",
                    RuntimeWarning,
                )

    def close(self, state: State | None = None, logger: Logger | None = None) -> None:
        logged = self._started or len(self._buffer) or self._pending_hyperparameters
        if not self._enabled() or not logged:
            return
        try:
            self._ensure_started()
            self.flush()
        finally:
            self._started = False
            self._finish()
