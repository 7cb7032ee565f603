"""Choosing the precision and the device by name (the `Precision`, `MixedPrecision` and
`Device` classes are at the top level, `trainkit.core`)."""

from trainkit.core._precision import (
    PRECISIONS,
    make_precision,
    resolve_device,
)

__all__ = [
    "PRECISIONS",
    "make_precision",
    "resolve_device",
]
