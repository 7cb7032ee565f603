"""What the low-precision norms share: choosing the dtype, running a norm in it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch

from trainkit.core import Precision

__all__ = [
    "LOW_PRECISION_DTYPES",
    "LowPrecisionDtype",
    "check_dtype",
    "dtype_for",
    "run_in_dtype",
]

LowPrecisionDtype = Literal["bfloat16", "float16"]
LOW_PRECISION_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def check_dtype(dtype: str | None) -> None:
    if dtype is not None and dtype not in LOW_PRECISION_DTYPES:
        raise ValueError(
            f"dtype {dtype!r} is not a low precision; use 'bfloat16', 'float16', or None "
            "(follow the run's precision)"
        )


def dtype_for(dtype: LowPrecisionDtype | None, precision: Precision) -> LowPrecisionDtype | None:
    """The configured dtype, else the run's autocast dtype; None for a run without autocast."""
    if dtype is not None:
        return dtype
    return {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(precision.autocast_dtype)


def run_in_dtype(
    dtype: torch.dtype, norm: Callable[..., torch.Tensor], x: torch.Tensor, *tensors: Any
) -> torch.Tensor:
    """``norm(x, *tensors)`` with every tensor cast to ``dtype`` and autocast off.

    Autocast would run norms in fp32, which is what these methods avoid. Under autocast the
    result stays in ``dtype`` (the next matmul wants it); otherwise it returns in ``x``'s
    dtype, so the module is a drop-in replacement in an fp32 model.
    """
    cast = [t.to(dtype) if isinstance(t, torch.Tensor) else t for t in tensors]
    with torch.autocast(x.device.type, enabled=False):
        out = norm(x.to(dtype), *cast)
    return out if torch.is_autocast_enabled(x.device.type) else out.to(x.dtype)
