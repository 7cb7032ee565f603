"""Warnings attributed to the user's line, not to the library line that noticed the problem
(for components too: `warn` skips every trainkit and torch frame).

A warning raised while the engine runs a callback would otherwise point at ``_engine.py``
(a fixed ``stacklevel`` counts frames that differ from one call path to another). Python
3.12's ``skip_file_prefixes`` does this; on 3.11 `warn` walks the stack itself.
"""

from __future__ import annotations

import sys
import warnings

__all__ = ["warn"]

_LIBRARIES = ("trainkit", "torch", "threading", "concurrent")
"""Top-level packages whose frames are skipped: trainkit's, torch's between them (a
checkpoint planner called by torch.distributed.checkpoint), and those that start the
library's background threads (so a warning there falls back to the line that warned)."""


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` at the nearest caller outside trainkit and torch:
    the user's script, test or notebook cell. With none (a background thread of the
    library), at the line that called `warn`."""
    frame, level = sys._getframe(1), 1
    while frame is not None and _is_library(frame.f_globals.get("__name__", "")):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level + 1 if frame is not None else 2)


def _is_library(module: str) -> bool:
    return module.split(".", 1)[0] in _LIBRARIES
