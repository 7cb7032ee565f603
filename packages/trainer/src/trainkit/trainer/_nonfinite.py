"""Noticing a NaN or infinite training loss without waiting for the device.

Each batch's loss is compared on its own device: a 0-d tensor keeps the first batch whose
loss was not finite, and its loss. Nothing is read back per batch: on the CPU the tensors
are host memory already; on an accelerator they are copied to pinned host memory without
blocking, and the copy is read once it has arrived (a batch or two later). `LossWatch.first`
is what the host knows so far; ``first(wait=True)`` waits for the device once (at the end
of ``fit``).
"""

from __future__ import annotations

import math

import torch

from trainkit.core.messages import warn

__all__ = ["NONFINITE_MODES", "LossWatch", "NonFiniteLossError", "check_nonfinite_mode"]

NONFINITE_MODES = ("error", "warn")
_NONE = 2**62  # "no bad batch yet": larger than any batch count


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; the message names the batch."""

    def __init__(self, batch: int, value: float, rank_hint: str = ""):
        self.batch = batch
        """The first batch (counted from 1) whose loss was not finite."""
        self.value = value
        """That loss (nan, inf or -inf; nan when it was seen on another rank)."""
        super().__init__(
            f"the training loss of batch {batch} (counted from 1) is {value}{rank_hint}: the "
            "weights are no longer trustworthy, so training stopped (resume from a checkpoint "
            "saved before that batch). Lower the learning rate, clip gradients "
            "(gradient_clipping), check the data of that batch, or train on with "
            "on_nonfinite_loss='warn'"
        )


def check_nonfinite_mode(mode: str) -> str:
    if mode not in NONFINITE_MODES:
        raise ValueError(
            f"on_nonfinite_loss={mode!r} is not a choice; use 'error' (stop with an error "
            "naming the batch) or 'warn' (warn once and train on)"
        )
    return mode


class LossWatch:
    """The first batch whose loss was not finite, kept on the loss's device."""

    def __init__(self) -> None:
        self._first: torch.Tensor | None = None  # int64, _NONE while every loss was finite
        self._value: torch.Tensor | None = None  # float32, that batch's loss
        self._host: torch.Tensor | None = None  # pinned copy of (first, value) in flight
        self._copied: torch.cuda.Event | None = None
        self._known: tuple[int, float] | None = None

    def update(self, loss: torch.Tensor, batch: int) -> tuple[int, float] | None:
        """Record ``loss`` (a 0-d tensor) as batch ``batch``'s, without a host sync; returns
        what `first` returns now."""
        if self._known is not None:
            return self._known
        if loss.is_cpu:
            value = loss.item()  # host memory: reading it waits for nothing
            if not math.isfinite(value):
                self._known = (batch, value)
            return self._known
        loss = loss.detach()
        if self._first is None:
            self._first = torch.full((), _NONE, dtype=torch.int64, device=loss.device)
            self._value = torch.zeros((), dtype=torch.float32, device=loss.device)
        assert self._value is not None
        here = torch.where(torch.isfinite(loss), _NONE, batch)
        self._value = torch.where(here < self._first, loss.float(), self._value)
        self._first = torch.minimum(self._first, here)
        self._start_copy()
        return self.first()

    def first(self, *, wait: bool = False) -> tuple[int, float] | None:
        """(batch, loss) of the first non-finite loss the host knows of, or None.

        ``wait=True`` waits for the device (use it once, where a sync costs nothing).
        """
        if self._known is None and self._first is not None:
            if wait:
                self._read(int(self._first.item()), float(self._value.item()))  # type: ignore[union-attr]
            elif self._copied is not None and self._copied.query():
                assert self._host is not None
                self._read(int(self._host[0].item()), float(self._host[1].item()))
                self._start_copy()
        return self._known

    def _read(self, batch: int, value: float) -> None:
        if batch != _NONE:
            self._known = (batch, value)

    def _start_copy(self) -> None:
        first = self._first
        if first is None or first.device.type != "cuda":
            return  # other devices: read when asked with wait=True
        if self._copied is not None and not self._copied.query():
            return  # the previous copy has not arrived yet
        if self._host is None:
            self._host = torch.empty(2, dtype=torch.float64, pin_memory=True)
            self._copied = torch.cuda.Event()
        assert self._value is not None and self._copied is not None
        self._host[0].copy_(first, non_blocking=True)
        self._host[1].copy_(self._value, non_blocking=True)
        self._copied.record()


def warn_nonfinite(batch: int, value: float) -> None:
    warn(
        f"the training loss of batch {batch} (counted from 1) is {value}; training goes on "
        "because on_nonfinite_loss='warn' (this warning is given once per fit)",
        RuntimeWarning,
    )
