"""``torch.compile`` as a Trainer option: checking its options and counting recompiles."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainkit.core import Logger

__all__ = ["RecompileWatch", "compile_options"]

log = logging.getLogger(__name__)

RECOMPILES_METRIC = "compile/recompiles"


@functools.cache
def _accepted() -> tuple[str, ...]:
    import torch

    names = inspect.signature(torch.compile).parameters
    return tuple(name for name in names if name != "model")


def compile_options(setting: Any) -> dict[str, Any] | None:
    """``torch.compile`` keyword arguments from the Trainer's ``compile`` (None: no compile).

    Raises:
        ValueError: ``setting`` is not a bool or a mapping, or names an argument that
            ``torch.compile`` does not take.
    """
    if setting is False or setting is None:
        return None
    if setting is True:
        return {}
    if not isinstance(setting, Mapping):
        raise ValueError(
            f"compile must be True, False or a dict of torch.compile keyword arguments "
            f"(e.g. {{'mode': 'max-autotune', 'dynamic': True}}), got {setting!r}"
        )
    accepted = _accepted()
    unknown = [key for key in setting if key not in accepted]
    if unknown:
        raise ValueError(
            f"compile: {', '.join(map(repr, unknown))} is not a torch.compile keyword argument; "
            f"accepted: {', '.join(accepted)}"
        )
    return dict(setting)


def _frames_compiled() -> int:
    from torch._dynamo.utils import counters

    return counters["frames"]["ok"]


class RecompileWatch:
    """Counts the frames Dynamo compiles after the first training batch, and logs the count
    as ``compile/recompiles`` whenever it changes.

    The first batch compiles each compiled region once; every compilation after it is a
    recompile: a new input shape (progressive resizing, sequence-length warm-up, a smaller
    last batch), evaluation mode, a changed guard. Dynamo's counters are process-wide, so a
    second compiled model trained in the same process is counted too.
    """

    def __init__(self) -> None:
        self._after_first: int | None = None
        self._logged = 0

    @property
    def recompiles(self) -> int:
        """Compilations since the end of the first training batch (0 before it)."""
        if self._after_first is None:
            return 0
        return _frames_compiled() - self._after_first

    def batch_end(self, logger: Logger) -> None:
        """Call once per training batch, after it ran."""
        if self._after_first is None:
            self._after_first = _frames_compiled()
            return
        count = _frames_compiled() - self._after_first
        if count != self._logged:
            self._logged = count
            log.info("torch.compile recompiled: %d recompile(s) since the first batch", count)
            logger.log_metrics({RECOMPILES_METRIC: count})
