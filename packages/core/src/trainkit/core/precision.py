"""Precision components and device selection."""

from trainkit.core._precision import (
    PRECISIONS,
    Device,
    MixedPrecision,
    Precision,
    make_precision,
    resolve_device,
)

__all__ = [
    "PRECISIONS",
    "Device",
    "MixedPrecision",
    "Precision",
    "make_precision",
    "resolve_device",
]
