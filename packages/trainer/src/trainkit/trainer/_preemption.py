"""Stopping a run cleanly when the cluster asks: catching the signals, agreeing across ranks.

While `Trainer.fit` runs, `SignalWatch` catches the preemption signals and only records them
(a signal handler that did more could interrupt a save half-way). At the end of each batch
the ranks agree whether any of them was signalled (`StopVote`), so all stop after the same
batch; the Trainer then sets ``state.preemption`` (a `trainkit.core.PreemptionRequest`)
before ``BATCH_CHECKPOINT``, the run's checkpointer saves there, ``FIT_END`` and ``close``
run, and ``fit`` raises `trainkit.core.TrainingPreempted`.
"""

from __future__ import annotations

import collections
import logging
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from trainkit.core import PreemptionRequest, dist

__all__ = ["SignalWatch", "StopVote", "check_preemption_signals"]

log = logging.getLogger(__name__)

_UNCATCHABLE = {"SIGKILL", "SIGSTOP"}


def check_preemption_signals(names: Sequence[str] | None) -> list[signal.Signals]:
    """The signals named (``"SIGTERM"``, ``"SIGUSR1"``, ...); raises on a bad name."""
    if names is None:
        return []
    if isinstance(names, str):
        raise ValueError(
            f"preemption_signals must be a list of signal names, got the string {names!r}; "
            f'write ["{names}"]'
        )
    found = []
    for name in names:
        upper = str(name).upper()
        upper = upper if upper.startswith("SIG") else f"SIG{upper}"
        if upper in _UNCATCHABLE:
            raise ValueError(f"preemption signal {name!r} cannot be caught by any process")
        try:
            found.append(signal.Signals[upper])
        except KeyError:
            known = sorted(s.name for s in signal.Signals if s.name not in _UNCATCHABLE)
            raise ValueError(
                f"preemption signal {name!r} is not a signal on this system; use names such "
                f"as 'SIGTERM', 'SIGINT', 'SIGUSR1' (known: {', '.join(known)})"
            ) from None
    return found


class SignalWatch:
    """Records the preemption signals while installed; the handler does nothing else."""

    def __init__(self, signals: Sequence[signal.Signals], grace_period: float | None):
        self.signals = list(signals)
        self.grace_period = grace_period
        self.received = ""
        self.received_at = 0.0
        self._previous: dict[signal.Signals, Any] = {}

    def install(self) -> None:
        """Catch the signals (only the main thread may: elsewhere nothing is installed)."""
        if not self.signals or threading.current_thread() is not threading.main_thread():
            return
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        """Put the handlers back as they were before `install`."""
        for sig, handler in self._previous.items():
            # None: a handler installed from C, which Python cannot put back.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self._previous.clear()

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.received:
            # A handler only sets flags: a second signal cannot interrupt the save.
            log.warning(
                "received %s again: the run is finishing its batch and saving its preemption "
                "checkpoint; ignored (SIGKILL stops the process at once)",
                name,
            )
            return
        self.received, self.received_at = name, time.monotonic()
        limit = "" if self.grace_period is None else f" within {self.grace_period:g} s"
        log.warning(
            "received %s: finishing the current batch, then saving a checkpoint and stopping%s",
            name,
            limit,
        )

    def request(self, batch: int) -> PreemptionRequest:
        """The stop every rank agreed on, as seen from this rank."""
        received_at = self.received_at if self.received else time.monotonic()
        deadline = None if self.grace_period is None else received_at + self.grace_period
        return PreemptionRequest(self.received, received_at, deadline, batch)


_side: list[Any] = []  # [(the run's group, the votes' group)]


class StopVote:
    """All ranks agree, once per batch, on "stop" flags without waiting for each other.

    ``vote(flags)`` sends this rank's flags (ints, reduced with max over ranks) and returns
    the agreed result of the call ``lag`` batches earlier: the collective runs in the
    background on the CPU (in a gloo group of its own), so the device is never waited for,
    and a vote has ``lag`` batches to complete before anyone reads it; every rank reads the
    same result at the same batch. On one rank (or with ``together=False``, for ranks that
    train independent replicas) ``vote`` returns ``flags`` at once. `finish` collects the
    votes in flight and runs one blocking round, so a flag raised at the last batch counts.
    """

    def __init__(self, size: int, *, together: bool = True, lag: int = 2):
        self.size = size
        self.lag = lag
        # Ranks that train independent replicas may run different numbers of batches:
        # each then decides alone.
        self.world = dist.get_world_size() if together else 1
        self._group = _side_group() if self.world > 1 else None
        self._pending: collections.deque[tuple[Any, torch.Tensor]] = collections.deque()

    def vote(self, flags: list[int]) -> list[int]:
        if self.world == 1:
            return flags
        agreed = self._collect() if len(self._pending) >= self.lag else [0] * self.size
        self._pending.append(self._send(flags))
        return agreed

    def finish(self, flags: list[int]) -> list[int]:
        """Collect the votes in flight and run a last one (collective: every rank calls it)."""
        if self.world == 1:
            return flags
        self._pending.append(self._send(flags))
        agreed = [0] * self.size
        while self._pending:
            agreed = [max(a, b) for a, b in zip(agreed, self._collect(), strict=True)]
        return agreed

    def drop(self) -> None:
        """Forget the votes in flight (after an error: the other ranks may never join them)."""
        self._pending.clear()

    def _send(self, flags: list[int]) -> tuple[Any, torch.Tensor]:
        tensor = torch.tensor(flags, dtype=torch.int64)
        work = torch.distributed.all_reduce(
            tensor, op=torch.distributed.ReduceOp.MAX, group=self._group, async_op=True
        )
        return work, tensor

    def _collect(self) -> list[int]:
        work, tensor = self._pending.popleft()
        work.wait()
        return tensor.tolist()


def _side_group() -> Any:
    """A gloo group of all ranks for the votes alone: nothing else runs on it, so the vote
    in flight never meets another collective (and the device is never involved)."""
    import torch.distributed as tdist

    default = tdist.group.WORLD
    if not _side or _side[0][0] is not default:  # a new process group
        # Collective: every rank starts its first fit at this point.
        _side[:] = [(default, tdist.new_group(backend="gloo"))]
    return _side[0][1]
