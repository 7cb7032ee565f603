"""Out-of-memory errors that not every rank meets, under auto-microbatching.

With ``device_train_microbatch_size="auto"`` (and an evaluator's
``device_eval_microbatch_size="auto"``) every rank retries a batch with half the
microbatch size when any rank ran out of memory, so the ranks must agree on it. A rank that
runs out of memory part-way through a forward or backward stops there, while the others
go on to the next collective of their strategy: an FSDP all-gather or reduce-scatter, a
DDP bucket all-reduce. That collective would meet the failed rank's vote instead of its
own counterpart: NCCL hangs, gloo fails. (Composer's ``generate_oom_hook`` describes the
same problem for FSDP1.)

So, while the microbatch size is being searched, the strategy calls `checkpoint` before
each collective it issues inside forward and backward
(`ParallelStrategy.add_oom_checkpoints`), and every rank ends each attempt at a batch in
`settle`, which repeats until every rank has ended its attempt. Both are one all-reduce
(max) of the same two integers, ``[ran out of memory, still running]``, so they pair with
each other in whatever order the ranks reach them: a rank still running meets the failed
rank's `settle` at its next checkpoint, learns of the failure, and raises
`torch.OutOfMemoryError` itself; the failed rank repeats `settle` until it has.

Checkpoints cost a collective and a host synchronisation each, so they are installed only
while the size is being searched: from the first batch until `QUIET_BATCHES` batches in a
row ran on every rank without running out of memory, and again after any rank does, as
Composer does; and only during each batch (`OOMCheckpoints`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from trainkit.core import SingleProcess, dist
from trainkit.trainer._private import loop_private

if TYPE_CHECKING:
    from trainkit.core import Evaluator, State

__all__ = ["QUIET_BATCHES", "OOMCheckpoints", "checkpoint", "oom_checkpoints_for", "settle"]

QUIET_BATCHES = 3
"""Batches in a row without an out-of-memory error on any rank after which the search ends
(no more checkpoints, until an out-of-memory error starts it again)."""

OTHER_RANK_MESSAGE = "another rank ran out of memory on this batch"


def _vote(failed: bool, running: bool, device: torch.device) -> tuple[bool, bool]:
    # One collective: whether any rank ran out of memory, whether any rank is still running.
    flags = torch.tensor([int(failed), int(running)], dtype=torch.int32, device=device)
    any_failed, any_running = dist.all_reduce(flags, "max").tolist()
    return bool(any_failed), bool(any_running)


def checkpoint(device: torch.device) -> None:
    """Called by a rank still running its attempt, before a collective of its strategy.

    Raises:
        torch.OutOfMemoryError: another rank ran out of memory on this attempt.
    """
    if dist.get_world_size() == 1:
        return
    any_failed, _ = _vote(False, True, device)
    if any_failed:
        raise torch.OutOfMemoryError(OTHER_RANK_MESSAGE)


def settle(failed: bool, device: torch.device) -> bool:
    """End this rank's attempt at a batch (``failed``: it ran out of memory); returns whether
    any rank did, the same on every rank. Meets the checkpoints of ranks still running
    until every rank has ended its attempt (one collective when all end together)."""
    if dist.get_world_size() == 1:
        return failed
    any_failed, any_running = _vote(failed, False, device)
    while any_running:
        any_failed, any_running = _vote(failed, False, device)
    return any_failed


class OOMCheckpoints:
    """Installs the strategy's checkpoints around each batch while the microbatch size is
    being searched.

    `train_batch` keeps one for a run of several ranks with auto-microbatching, and
    evaluation one per evaluator (in ``state.loop_private``, `LoopPrivate`):
    `arm` before each attempt at a batch, `batch_done` when the batch is done, `disarm`
    after it. Nothing else (evaluation, callbacks between batches, a deep copy of the
    model) ever meets them.
    """

    def __init__(self) -> None:
        self._remove: Callable[[], None] | None = None
        self._quiet = 0  # batches in a row that no rank ran out of memory on

    @property
    def searching(self) -> bool:
        """Whether the size is still being searched: fewer than `QUIET_BATCHES` batches in
        a row ran without an out-of-memory error on any rank."""
        return self._quiet < QUIET_BATCHES

    def arm(self, state: State) -> None:
        """Install the checkpoints while searching, unless they are installed."""
        if self._remove is None and self.searching:
            device = state.device
            self._remove = state.parallelism.add_oom_checkpoints(
                state.model, lambda: checkpoint(device)
            )

    def batch_done(self, out_of_memory: bool) -> None:
        """Count a finished batch (``out_of_memory``: some rank ran out of memory on an
        attempt at it, which starts the search again)."""
        self._quiet = 0 if out_of_memory else self._quiet + 1

    def disarm(self) -> None:
        """Remove the checkpoints, if installed."""
        if self._remove is not None:
            remove, self._remove = self._remove, None
            remove()


def oom_checkpoints_for(state: State, evaluator: Evaluator | None = None) -> OOMCheckpoints | None:
    """The run's `OOMCheckpoints` for the training step (or for ``evaluator``), made on
    first use and kept in ``state.loop_private``; None where no rank can be left waiting in
    a collective: one rank, or ranks that train independent replicas."""
    if dist.get_world_size() == 1 or isinstance(state.parallelism, SingleProcess):
        return None
    private = loop_private(state)
    if evaluator is None:
        if private.oom_checkpoints is None:
            private.oom_checkpoints = OOMCheckpoints()
        return private.oom_checkpoints
    checkpoints = private.evaluator_checkpoints(evaluator)
    if checkpoints is None:
        checkpoints = OOMCheckpoints()
        private.eval_oom_checkpoints[id(evaluator)] = (evaluator, checkpoints)
    return checkpoints
