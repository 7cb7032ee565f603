"""`FitGuard`: what ``fit`` watches besides training itself.

- Preemption signals (`trainkit.core.PreemptionRequest`): every rank stops after the same batch,
  the checkpointer saves, ``fit`` raises `TrainingPreempted` (exit status 75).
- Non-finite losses (`trainkit.trainer._nonfinite`): an error naming the batch, or one warning.
- Errors: when ``fit`` raises, ``FIT_ABORTED`` lets components let go of what they hold.

Both checks ride on one background vote per batch (`StopVote`): on several ranks they are
decided on the same batch everywhere, so no rank is left waiting in a collective.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, NoReturn

import torch

from trainkit.core import Event, SingleProcess, TrainingPreempted
from trainkit.trainer._nonfinite import _NONE, LossWatch, NonFiniteLossError, warn_nonfinite
from trainkit.trainer._preemption import SignalWatch, StopVote

if TYPE_CHECKING:
    import signal

    from trainkit.core import Engine, State

__all__ = ["FitGuard"]

log = logging.getLogger(__name__)


class FitGuard:
    """Watches one ``fit``: `running` around it, `after_batch` after every batch."""

    def __init__(
        self,
        signals: Sequence[signal.Signals],
        grace_period: float | None,
        on_nonfinite_loss: str,
    ):
        self.signals = signals
        self.grace_period = grace_period
        self.on_nonfinite_loss = on_nonfinite_loss
        self.watch = SignalWatch(signals, grace_period)
        self.losses = LossWatch()
        self.vote: StopVote | None = None
        self._warned = False

    @contextlib.contextmanager
    def running(self, state: State, engine: Engine) -> Iterator[None]:
        """Install the signal handlers for the ``with`` body and restore them after it; on
        an error fire ``FIT_ABORTED`` (its own failures become notes on the error)."""
        self.watch = SignalWatch(self.signals, self.grace_period)
        self.losses, self._warned = LossWatch(), False
        state.preemption = None
        # SingleProcess on several ranks trains independent replicas, not in lockstep.
        self.vote = StopVote(2, together=not isinstance(state.parallelism, SingleProcess))
        self.watch.install()
        try:
            yield
        except BaseException as err:
            self.vote.drop()  # the other ranks may never join the vote in flight
            if not isinstance(err, TrainingPreempted):
                _fire_aborted(engine, err)
            raise
        finally:
            self.watch.restore()

    def after_batch(self, state: State, loss: torch.Tensor | None) -> bool:
        """Record the batch; True when every rank stops now because of a preemption signal.

        Raises `NonFiniteLossError` once any rank's loss was not finite (with
        ``on_nonfinite_loss="error"``), on every rank at the same batch.
        """
        vote = self.vote
        assert vote is not None, "after_batch runs inside running()"
        if loss is not None:
            bad = self.losses.update(loss, state.timestamp.batch)
        else:
            bad = self.losses.first()
        if vote.world == 1 and not self.watch.received and bad is None:
            return False  # alone, with nothing to act on: this runs every batch
        return self._act(state, vote.vote(self._flags(wait=False)))

    def finish(self, state: State) -> None:
        """After the last batch (collective): the last votes, waiting for the device once."""
        assert self.vote is not None, "finish runs inside running()"
        self._act(state, self.vote.finish(self._flags(wait=True)))

    def _flags(self, wait: bool) -> list[int]:
        bad = self.losses.first(wait=wait)
        return [1 if self.watch.received else 0, _NONE - bad[0] if bad is not None else 0]

    def _act(self, state: State, agreed: list[int]) -> bool:
        preempt, bad = agreed
        if bad and not self._warned:
            batch = _NONE - bad
            mine = self.losses.first()
            value = mine[1] if mine is not None and mine[0] == batch else math.nan
            hint = "" if mine is not None and mine[0] == batch else " on another rank"
            if self.on_nonfinite_loss == "error":
                raise NonFiniteLossError(batch, value, hint)
            self._warned = True
            warn_nonfinite(batch, value)
        if preempt and state.preemption is None:
            state.preemption = self.watch.request(state.timestamp.batch)
            state.stop_training()
            return True
        return False

    def stop_preempted(self, state: State) -> NoReturn:
        """After ``FIT_END`` and ``close`` of a preempted run: log how long the stop took
        and raise `TrainingPreempted`."""
        request = state.preemption
        assert request is not None
        seconds = time.monotonic() - request.received_at
        limit = "" if self.grace_period is None else f" (grace period {self.grace_period:g} s)"
        log.warning(
            "preempted by %s: %.2f s from the signal to exit%s",
            request.describe(),
            seconds,
            limit,
        )
        raise TrainingPreempted(request, seconds)


def _fire_aborted(engine: Engine, err: BaseException) -> None:
    for failure in engine.run_cleanup_event(Event.FIT_ABORTED):
        err.add_note(f"while handling it, FIT_ABORTED failed too: {failure}")
