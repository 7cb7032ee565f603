"""`Precision` (a component) and `Device`: where and in which dtype the step runs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

import torch

__all__ = [
    "NO_AUTOCAST",
    "PRECISIONS",
    "Device",
    "MixedPrecision",
    "Precision",
    "check_device",
    "check_precision",
    "make_precision",
    "resolve_device",
]


PRECISIONS = ("fp32", "amp_bf16", "amp_fp16")
"""The precision names `make_precision` accepts."""


class Precision:
    """How the step runs numerically: autocast, loss scaling, the optimizer step.

    One object owns all of it, so the loop never branches on a precision and a parallel
    strategy can supply its own (`ParallelStrategy.precision_for`). This base class is
    fp32: no autocast, plain backward and step. Parameters and optimizer state stay fp32
    in every precision.
    """

    name: str = "fp32"
    """The name a config gives (``"fp32"``, ``"amp_bf16"``, ``"amp_fp16"``)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype the forward pass computes in under autocast (None: no autocast)."""
        return None

    @property
    def scales_loss(self) -> bool:
        """Whether the loss is scaled, so that a step may be skipped on inf/NaN gradients."""
        return False

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """The context for forward passes and the loss."""
        return NO_AUTOCAST

    def backward(self, loss: torch.Tensor) -> None:
        """Backward through ``loss`` (scaled first, where the precision scales it)."""
        loss.backward()

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Make ``optimizer``'s gradients true gradients (before clipping or reading them)."""

    def step(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """Step every optimizer."""
        for optimizer in optimizers:
            optimizer.step()

    def reset_after_oom(self) -> None:
        """Forget the failed attempt's per-step state (called before a retry)."""

    def state_dict(self) -> dict[str, Any]:
        """State saved with the run (the grad scaler's, for fp16)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, device={str(self.device)!r})"


class MixedPrecision(Precision):
    """Autocast to bf16 or fp16; fp16 scales the loss with a gradient scaler.

    Args:
        device: where the step runs.
        dtype: ``torch.bfloat16`` or ``torch.float16``.
        scaler_factory: builds the gradient scaler for fp16 (default:
            ``torch.amp.GradScaler(device.type)``); a strategy that shards gradients
            passes its own (e.g. FSDP's ``ShardedGradScaler``).
    """

    def __init__(
        self,
        device: torch.device | str,
        dtype: torch.dtype,
        *,
        scaler_factory: Callable[[], torch.amp.GradScaler] | None = None,
    ) -> None:
        super().__init__(device)
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"mixed precision computes in bfloat16 or float16, not {dtype}")
        self.dtype = dtype
        self.name = "amp_bf16" if dtype == torch.bfloat16 else "amp_fp16"
        self.scaler_factory = scaler_factory or (lambda: torch.amp.GradScaler(self.device.type))
        self.scaler = self.scaler_factory() if dtype == torch.float16 else None

    @property
    def autocast_dtype(self) -> torch.dtype:
        return self.dtype

    @property
    def scales_loss(self) -> bool:
        return self.scaler is not None

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        if self.scaler is None:
            super().step(optimizers)
            return
        for optimizer in optimizers:
            self.scaler.step(optimizer)
        self.scaler.update()

    def reset_after_oom(self) -> None:
        # A fresh scaler with the old one's scale and growth counter: its per-step records
        # of the failed attempt (unscaled optimizers, inf checks) are gone.
        if self.scaler is not None:
            saved = self.scaler.state_dict()
            self.scaler = self.scaler_factory()
            if saved:
                self.scaler.load_state_dict(saved)

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def make_precision(value: Precision | str | None, device: torch.device) -> Precision:
    """A `Precision` from its name (``"fp32"``, ``"amp_bf16"``, ``"amp_fp16"``) or as given."""
    if isinstance(value, Precision):
        return value
    name = check_precision(value)
    if name == "fp32":
        return Precision(device)
    if name == "amp_bf16":
        return MixedPrecision(device, torch.bfloat16)
    if device.type != "cuda":
        raise ValueError(
            f"precision 'amp_fp16' needs a CUDA device (it uses a gradient scaler), but the "
            f"device is {device.type!r}; use 'amp_bf16' or 'fp32' on {device.type}"
        )
    return MixedPrecision(device, torch.float16)


def check_precision(value: Precision | str | None) -> str:
    """The precision's name; raises for a name that is not one (without building anything)."""
    if isinstance(value, Precision):
        return value.name
    name = "fp32" if value is None else value
    if name == "amp_fp8":
        raise ValueError(
            "precision 'amp_fp8' is not a precision in trainkit: fp8 training is the "
            "Float8Training algorithm (torchao's float8 linears, GPUs of SM 8.9+) under bf16 "
            "autocast; use precision='amp_bf16' with algorithms=[Float8Training()] (from "
            'trainkit.algorithms; pip install "trainkit-algorithms[fp8]"); accepted '
            f"precisions: {', '.join(map(repr, PRECISIONS))}"
        )
    if name not in PRECISIONS:
        raise ValueError(
            f"unknown precision {value!r}; accepted: {', '.join(map(repr, PRECISIONS))} or a "
            "trainkit.core.Precision object"
        )
    return name


class Device(StrEnum):
    CPU = "cpu"
    CUDA = "cuda"
    MPS = "mps"
    AUTO = "auto"


_DEVICE_ALIASES = {"gpu": Device.CUDA}
"""Other names for a device kind: ``"gpu"`` is Composer's spelling of ``"cuda"``."""


def check_device(device: Device | str | torch.device | None) -> Device | None:
    """The kind of device named (None for a `torch.device`); raises for an unknown name.

    ``"gpu"`` (Composer's spelling) is accepted as ``"cuda"``.
    """
    if isinstance(device, torch.device):
        return None
    if isinstance(device, str) and device in _DEVICE_ALIASES:
        return _DEVICE_ALIASES[device]
    try:
        return Device("auto" if device is None else device)
    except ValueError:
        accepted = ", ".join(repr(d.value) for d in Device)
        raise ValueError(
            f"unknown device {device!r}; accepted: {accepted}, 'gpu' (same as 'cuda') or a "
            "torch.device"
        ) from None


def resolve_device(device: Device | str | torch.device | None, local_rank: int = 0) -> torch.device:
    """Turn ``"auto"``/``"cuda"``/... into a concrete `torch.device` for this rank."""
    if isinstance(device, torch.device):
        return device
    kind = check_device(device)
    if kind == Device.AUTO:
        if torch.cuda.is_available():
            kind = Device.CUDA
        elif torch.backends.mps.is_available():
            kind = Device.MPS
        else:
            kind = Device.CPU
    if kind == Device.CUDA:
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {str(device)!r} was requested but no CUDA device is available; use "
                "'cpu' or 'auto'"
            )
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    if kind == Device.MPS and not torch.backends.mps.is_available():
        raise ValueError("device 'mps' was requested but MPS is not available; use 'cpu' or 'auto'")
    return torch.device(kind.value)


NO_AUTOCAST = contextlib.nullcontext()
"""What `Precision.autocast` returns where there is nothing to cast: a loop may skip
entering it (``if autocast is NO_AUTOCAST``), as the Trainer's step does."""
