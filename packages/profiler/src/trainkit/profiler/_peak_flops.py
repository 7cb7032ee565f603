"""Peak dense FLOP/s of common GPUs, by precision, for model FLOPs utilisation (MFU)."""

from __future__ import annotations

import re

import torch

from trainkit.core import Precision
from trainkit.core.precision import PRECISIONS

__all__ = ["PEAK_FLOPS", "device_peak_flops", "peak_flops_for"]

# Dense (no sparsity) peaks from the vendors' datasheets, per GPU. "fp32" is plain FP32;
# "tf32" applies to fp32 runs whose matmuls may use TF32; "bf16"/"fp16" to AMP runs.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "h200": {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},
    "h100-sxm": {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},
    "h100-nvl": {"fp32": 60e12, "tf32": 417.5e12, "bf16": 835.5e12, "fp16": 835.5e12},
    "h100-pcie": {"fp32": 51e12, "tf32": 378e12, "bf16": 756e12, "fp16": 756e12},
    "a100": {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
    "l40s": {"fp32": 91.6e12, "tf32": 183e12, "bf16": 362.05e12, "fp16": 362.05e12},
    "l4": {"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12, "fp16": 121e12},
    "a10": {"fp32": 31.2e12, "tf32": 62.5e12, "bf16": 125e12, "fp16": 125e12},
    "v100-sxm": {"fp32": 15.7e12, "tf32": 15.7e12, "fp16": 125e12},
    "v100-pcie": {"fp32": 14e12, "tf32": 14e12, "fp16": 112e12},
    "t4": {"fp32": 8.1e12, "tf32": 8.1e12, "fp16": 65e12},
}

# Checked in order against the lower-cased device name (torch.cuda.get_device_name).
_NAME_PATTERNS = (
    (r"h200", "h200"),
    (r"h100.*nvl", "h100-nvl"),
    (r"h100.*pcie", "h100-pcie"),
    (r"h100", "h100-sxm"),
    (r"a100", "a100"),
    (r"l40s", "l40s"),
    (r"\bl4\b", "l4"),
    (r"\ba10\b", "a10"),
    (r"v100.*pcie", "v100-pcie"),
    (r"v100", "v100-sxm"),
    (r"\bt4\b", "t4"),
)


# The table's column for each precision name (fp32 depends on the matmul precision).
_NAME_KEYS = {"amp_bf16": "bf16", "amp_fp16": "fp16"}
_DTYPE_KEYS = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def _fp32_key() -> str:
    return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def _precision_key(precision: Precision | str) -> str:
    if isinstance(precision, Precision):
        # By what the forward computes in, so a strategy's own precision is keyed alike.
        dtype = precision.autocast_dtype
        return _DTYPE_KEYS[dtype] if dtype in _DTYPE_KEYS else _fp32_key()
    if precision not in PRECISIONS:
        raise ValueError(
            f"unknown precision {precision!r}; accepted: {', '.join(map(repr, PRECISIONS))} "
            "or a trainkit.core.Precision object"
        )
    return _NAME_KEYS.get(precision, _fp32_key())


def peak_flops_for(device_name: str, precision: Precision | str) -> float | None:
    """Peak FLOP/s of one ``device_name`` GPU at ``precision`` (a name such as
    ``"amp_bf16"``, or the run's `Precision`, keyed by its ``autocast_dtype``), or None
    when not in the table."""
    key = _precision_key(precision)
    name = device_name.lower()
    for pattern, gpu in _NAME_PATTERNS:
        if re.search(pattern, name):
            return PEAK_FLOPS[gpu].get(key)
    return None


def device_peak_flops(device: torch.device, precision: Precision | str) -> float | None:
    """Peak FLOP/s of ``device`` (CUDA only; None elsewhere or for an unknown GPU)."""
    if device.type != "cuda":
        return None
    return peak_flops_for(torch.cuda.get_device_name(device), precision)
