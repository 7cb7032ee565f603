"""What the Trainer says about where a run starts: resumed from a checkpoint, or complete.

One line on rank 0, from the Trainer itself, so that a Python script hears it as
``trainkit train`` does. ``state.resumed_from`` is set by whoever loaded the run's state at
BEFORE_LOAD (trainkit-checkpoint's `Checkpointer`); the Trainer does not know the loader.
"""

from __future__ import annotations

from trainkit.core import Engine, State
from trainkit.trainer._eval import evaluate

__all__ = ["finish_complete_run", "report_complete", "report_resume"]


def report_resume(state: State) -> None:
    """After loading: where the run resumed (not for a run already complete: `fit` says so)."""
    if state.resumed_from is None or state.is_done():
        return
    at = state.timestamp.batch
    if at:
        _say(state, f"resuming from {state.resumed_from} at batch {at}")
    else:  # weights to start from, e.g. to fine-tune
        _say(state, f"starting from {state.resumed_from}")


def report_complete(state: State) -> None:
    """At the start of a ``fit`` with nothing left to train."""
    where = f" (resumed from {state.resumed_from})" if state.resumed_from is not None else ""
    _say(
        state,
        f"run already complete at batch {state.timestamp.batch}: max_duration is "
        f"{state.max_duration}{where}; nothing to train (give fit a duration, or a longer "
        "max_duration, to train on)",
    )


def finish_complete_run(state: State, engine: Engine, last_eval: dict) -> dict:
    """The metrics of a run resumed complete: its evaluators' now, if none were computed in
    this process (its checkpoint holds the model, not the results), else ``last_eval``."""
    if state.resumed_from is None or last_eval or not state.evaluators:
        return last_eval
    return evaluate(state, engine, state.evaluators)


def _say(state: State, line: str) -> None:
    if state.rank == 0:
        print(line, flush=True)
