"""`Precision` and `Device`: choosing where and in which dtype the step runs."""

from __future__ import annotations

import contextlib
from enum import StrEnum

import torch

__all__ = ["Device", "Precision", "autocast", "resolve_device"]


class Precision(StrEnum):
    """Numeric precision of the forward pass; parameters and optimizer stay fp32."""

    FP32 = "fp32"
    AMP_FP16 = "amp_fp16"
    AMP_BF16 = "amp_bf16"

    @classmethod
    def parse(cls, value: Precision | str | None, device: torch.device) -> Precision:
        if value is None:
            return cls.FP32
        try:
            precision = cls(value)
        except ValueError:
            accepted = ", ".join(repr(p.value) for p in cls)
            raise ValueError(f"unknown precision {value!r}; accepted: {accepted}") from None
        if precision == cls.AMP_FP16 and device.type != "cuda":
            raise ValueError(
                f"precision 'amp_fp16' needs a CUDA device (it uses a gradient scaler), but the "
                f"device is {device.type!r}; use 'amp_bf16' or 'fp32' on {device.type}"
            )
        return precision


class Device(StrEnum):
    CPU = "cpu"
    CUDA = "cuda"
    MPS = "mps"
    AUTO = "auto"


def resolve_device(device: Device | str | torch.device | None, local_rank: int = 0) -> torch.device:
    """Turn ``"auto"``/``"cuda"``/... into a concrete `torch.device` for this rank."""
    if isinstance(device, torch.device):
        return device
    name = "auto" if device is None else device
    try:
        kind = Device(name)
    except ValueError:
        accepted = ", ".join(repr(d.value) for d in Device)
        raise ValueError(f"unknown device {device!r}; accepted: {accepted}") from None
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
                "device 'cuda' was requested but no CUDA device is available; use 'cpu' or 'auto'"
            )
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    if kind == Device.MPS and not torch.backends.mps.is_available():
        raise ValueError("device 'mps' was requested but MPS is not available; use 'cpu' or 'auto'")
    return torch.device(kind.value)


def autocast(precision: Precision, device: torch.device) -> contextlib.AbstractContextManager[None]:
    """Autocast for ``precision`` on ``device``; a no-op context for fp32."""
    if precision == Precision.FP32:
        return _NO_AUTOCAST
    dtype = torch.float16 if precision == Precision.AMP_FP16 else torch.bfloat16
    return torch.autocast(device_type=device.type, dtype=dtype)


_NO_AUTOCAST = contextlib.nullcontext()
