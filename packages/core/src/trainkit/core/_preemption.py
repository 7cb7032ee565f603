"""A preempted run, as the loop and the checkpointer share it: the agreed stop
(`PreemptionRequest`, in ``state.preemption``), the exception ``fit`` raises and its exit code.

A cluster that reclaims a machine (Kubernetes, SLURM, spot instances) sends SIGTERM and
kills the process a grace period later. A loop that catches the signal (trainkit-trainer's
does) stops every rank after the same batch, sets ``state.preemption`` before
``BATCH_CHECKPOINT`` (a checkpointer saves there), and raises `TrainingPreempted`, a
`SystemExit` with code 75 (``EX_TEMPFAIL``: try again later).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PREEMPTED_EXIT_CODE", "PreemptionRequest", "TrainingPreempted"]

PREEMPTED_EXIT_CODE = 75
"""The exit status of a preempted run: ``EX_TEMPFAIL`` from ``sysexits.h`` ("try again
later"); a scheduler that restarts on it resumes the run from its last checkpoint."""


class TrainingPreempted(SystemExit):
    """``fit`` stopped because the process was asked to (SIGTERM, SIGINT, ...).

    A `SystemExit` with code `PREEMPTED_EXIT_CODE` (75): a script that does not catch it
    exits with that status, without a traceback. The checkpoint (if the run saves any) was
    published, or abandoned when the grace period ran out, before it was raised.
    """

    def __init__(self, request: PreemptionRequest, seconds: float):
        super().__init__(PREEMPTED_EXIT_CODE)
        self.request = request
        """What stopped the run, where it stopped and what was saved."""
        self.seconds = seconds
        """Seconds from the signal (on this rank) to the exception."""

    def __str__(self) -> str:
        return f"training preempted: {self.request.describe()}"


@dataclass
class PreemptionRequest:
    """The agreed stop, as ``state.preemption`` shows it from the last batch on.

    A checkpointer saves at ``BATCH_CHECKPOINT`` when it is set, gives the save up at
    ``deadline``, and records the outcome in ``checkpoint`` or ``abandoned``.
    """

    signal: str
    """The signal this rank received ("" on a rank that was not signalled itself)."""
    received_at: float
    """`time.monotonic` when this rank received it (or learnt of the stop)."""
    deadline: float | None
    """`time.monotonic` by which the save must be published (None: no limit)."""
    batch: int = 0
    """The batch (counted from 1) after which every rank stopped."""
    checkpoint: str = ""
    """Where the preemption checkpoint was published ("" if none was)."""
    abandoned: str = ""
    """Why the save was given up ("" if it was not)."""

    def describe(self) -> str:
        by = self.signal or "a signal to another rank"
        if self.checkpoint:
            saved = f"checkpoint {self.checkpoint} saved"
        elif self.abandoned:
            saved = f"checkpoint not saved ({self.abandoned}); the previous one stays the latest"
        else:
            saved = "no checkpoint saved (the run has no checkpointer)"
        return f"{by} after batch {self.batch}, {saved}"
