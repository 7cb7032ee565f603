"""What trainkit-trainer's loop keeps in `State.loop_private` from batch to batch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainkit.core import Evaluator, State
    from trainkit.trainer._compile import RecompileWatch
    from trainkit.trainer._goodput import GoodputTracker
    from trainkit.trainer._oom import OOMCheckpoints

__all__ = ["LoopPrivate", "loop_private"]


@dataclass(eq=False)
class LoopPrivate:
    """The loop's own objects of one run (none of them saved in checkpoints)."""

    recompiles: RecompileWatch | None = None
    """Counts ``torch.compile`` recompilations when the model is compiled (set by
    `prepare_run`; `finish_batch` logs the count as ``compile/recompiles``)."""
    oom_checkpoints: OOMCheckpoints | None = None
    """On several ranks with auto-microbatching: the strategy's out-of-memory checkpoints,
    installed while the training microbatch size is being searched (set by `train_batch`)."""
    eval_oom_checkpoints: dict[int, tuple[Evaluator, OOMCheckpoints]] = field(default_factory=dict)
    """The same for each evaluator with ``device_eval_microbatch_size="auto"``, by its id."""
    goodput: GoodputTracker | None = None
    """On rank 0 of a `Trainer`'s run: its goodput bookkeeping (`prepare_run` marks the
    loading in it, `finish_batch` counts each committed step)."""

    def evaluator_checkpoints(self, evaluator: Evaluator) -> OOMCheckpoints | None:
        kept = self.eval_oom_checkpoints.get(id(evaluator))
        return kept[1] if kept is not None and kept[0] is evaluator else None


def loop_private(state: State) -> LoopPrivate:
    """``state.loop_private``, made on first use (a hand-written loop may not have one)."""
    kept: Any = state.loop_private
    if kept is None:
        kept = state.loop_private = LoopPrivate()
    elif not isinstance(kept, LoopPrivate):
        raise TypeError(
            f"state.loop_private holds a {type(kept).__name__}, set by another loop; "
            "trainkit-trainer's phases keep their own objects there"
        )
    return kept
