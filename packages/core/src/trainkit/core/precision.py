"""Choosing the precision and the device by name, and checking a name without building
anything (the `Precision`, `MixedPrecision` and `Device` classes are at the top level,
`trainkit.core`)."""

from trainkit.core._precision import (
    NO_AUTOCAST,
    PRECISIONS,
    check_device,
    check_precision,
    make_precision,
    resolve_device,
)

__all__ = [
    "NO_AUTOCAST",
    "PRECISIONS",
    "check_device",
    "check_precision",
    "make_precision",
    "resolve_device",
]
