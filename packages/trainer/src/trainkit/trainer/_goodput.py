"""The Trainer's own goodput bookkeeping: the restart parts of this process, its records in
the run's ledger, its heartbeat, and the ``goodput/...`` metrics (`trainkit.trainer.goodput`
reads the ledger back).

Per step (`GoodputTracker.batch_end`, from `finish_batch`): a comparison and, when the step
was committed, one store into a memory-mapped page: no system call, no file I/O. The page is
the kernel's, so it survives a SIGKILL, and the next process reads it back. Records are
appended (one ``write`` of a whole line, then ``fsync``) when the process is ready to train,
at its first step, after each checkpoint the run's `Checkpointer` saves (seen at the next
step), every `RECORD_INTERVAL_S` seconds, at the end of each ``fit`` and at ``close``.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainkit.core import dist, plugins
from trainkit.core.messages import warn
from trainkit.trainer._private import loop_private
from trainkit.trainer.goodput import (
    BEAT,
    BEAT_MAGIC,
    BEAT_SIZE,
    HEARTBEAT,
    LEDGER,
    decode_beat,
    parse_lines,
    summarize,
)

if TYPE_CHECKING:
    from trainkit.core import Logger, State

__all__ = ["GoodputTracker", "checkpointer_of", "process_started"]

RECORD_INTERVAL_S = 60.0
"""Seconds between a process's ``progress`` records (and logged goodput metrics)."""

_IMPORTED = time.time()  # trainkit-trainer imported: the end of the ``import`` part
_claimed: set[int] = set()  # processes whose start a Trainer has reported (by pid)


def process_started() -> float | None:
    """``time.time()`` when this process started, from ``/proc/self/stat`` (to 10 ms; a
    forked process: when it was forked). None where there is no ``/proc`` (not Linux)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        # Fields after the command name, which may hold spaces and ')': field 22, the
        # start in clock ticks since boot, is the 20th after it.
        ticks = int(stat.rpartition(")")[2].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - max(0.0, age)


def checkpointer_of(state: State) -> Any:
    """The run's `Checkpointer` that saves (trainkit-checkpoint's, found by entry point, as
    the Trainer's ``save_folder`` builds it), or None."""
    if "checkpointer" not in plugins.available("trainkit.callbacks"):
        return None
    checkpointer = plugins.load("trainkit.callbacks", "checkpointer")
    for callback in state.callbacks:
        if isinstance(callback, checkpointer) and callback.config.folder is not None:
            return callback
    return None


class GoodputTracker:
    """One Trainer's goodput: built first thing in its constructor, it marks where each
    restart part ends (`mark`), then keeps the ledger from `open` to `close` on rank 0."""

    def __init__(self) -> None:
        now = time.time()
        pid = os.getpid()
        started = process_started() if pid not in _claimed else None
        _claimed.add(pid)
        self.started = now if started is None else min(started, now)
        # (part, when it ended), in order; a later Trainer of the process starts at its own.
        self.marks: list[tuple[str, float]] = []
        if started is not None:
            self.marks += [("import", min(max(started, _IMPORTED), now)), ("setup", now)]
        self.records: list[dict[str, Any]] = []
        self.n = 0
        self._logger: Logger | None = None
        self._fd: int | None = None
        self._beat: mmap.mmap | None = None
        self._batch = -1
        self._wct = 0.0
        self._due = -math.inf  # the first committed step is recorded at once
        self._at = 0.0  # when the last committed step ended
        self._checkpointer: Any = None  # the run's Checkpointer, whose saves are recorded
        self._saved_at: Any = None  # its last save, as recorded
        self._first_step_done = False
        self._compiled = False
        self._folder: Path | None = None  # the ledger's folder, set by open
        self._start: dict[str, Any] | None = None  # this start, until attach records it
        self._offset = time.time() - time.perf_counter()  # perf_counter -> time.time()

    def mark(self, part: str) -> None:
        """The restart part ``part`` ends now."""
        self.marks.append((part, time.time()))

    def parts(self) -> dict[str, float]:
        """The restart parts marked so far, in seconds; the rendezvous (`init_distributed`)
        is taken out of the part it fell in. They add up to the time since the start."""
        rendezvous = dist.rendezvous_interval()
        parts: dict[str, float] = {}
        begin = self.started
        for name, end in self.marks:
            seconds = max(0.0, end - begin)
            if rendezvous is not None:
                overlap = min(end, rendezvous[1]) - max(begin, rendezvous[0])
                if overlap > 0:
                    parts["rendezvous"] = parts.get("rendezvous", 0.0) + overlap
                    seconds -= overlap
            parts[name] = seconds
            begin = max(begin, end)
        return parts

    # --- the ledger ------------------------------------------------------------------------

    def open(self, state: State, logger: Logger) -> None:
        """The process is ready to train (loaded): note this start. The ledger in the run's
        checkpoint folder is read and written from `attach` on, once the run's first
        FIT_START has passed: a run the Checkpointer refuses there (a folder of another
        run's checkpoints) writes nothing into it."""
        self._logger = logger
        self._compiled = loop_private(state).recompiles is not None
        self._checkpointer = checkpointer = checkpointer_of(state)
        # Its folder, once local (a URL or a folder named by the run's fields: a path by now).
        folder = checkpointer.folder if checkpointer is not None else None
        if checkpointer is not None:
            self._saved_at = checkpointer.saved_at
        self._folder = folder if isinstance(folder, Path) else None
        timestamp = state.timestamp
        self._batch, self._wct = timestamp.batch, timestamp.total_wct
        self._start = {
            "run": state.run_name,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": self.started,
            **self._where(time.time(), timestamp.batch, timestamp.total_wct),
            "resumed_from": state.resumed_from,
            "parts": self.parts(),
        }

    def attach(self) -> None:
        """After the first FIT_START: read the ledger (none: keep the records in memory),
        add the previous process's last heartbeat and this start. Once per process."""
        if self._start is None:
            return
        start, self._start = self._start, None
        if self._folder is not None:
            try:
                self._open_files(self._folder)
            except OSError as err:
                self._give_up_files(f"cannot keep the goodput ledger in {self._folder}: {err}")
        self.n = 1 + max((r.get("n", -1) for r in self.records if "n" in r), default=-1)
        self._append({"event": "start", "n": self.n, **start})
        self._write_beat(time.time())

    def _open_files(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        ledger = folder / LEDGER
        existing = ledger.read_bytes() if ledger.exists() else b""
        self.records = parse_lines(existing)
        self._fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if existing and not existing.endswith(b"\n"):  # a line cut short by a crash
            os.write(self._fd, b"\n")
        beat_fd = os.open(folder / HEARTBEAT, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(beat_fd).st_size < BEAT_SIZE:
                os.ftruncate(beat_fd, BEAT_SIZE)
            self._beat = mmap.mmap(beat_fd, BEAT_SIZE)
        finally:
            os.close(beat_fd)  # the mapping keeps the file
        last = decode_beat(self._beat[:BEAT_SIZE])
        if last is not None and any(r.get("n") == last["n"] for r in self.records):
            self._append(last)  # the previous process's last committed step
        self._beat[: len(BEAT_MAGIC)] = BEAT_MAGIC

    def _give_up_files(self, reason: str) -> None:
        warn(f"{reason}; goodput is counted for this process alone", RuntimeWarning)
        self._close_files()

    def _close_files(self) -> None:
        if self._beat is not None:
            self._beat.close()
            self._beat = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _append(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        if self._fd is None:
            return
        try:
            os.write(self._fd, (json.dumps(record) + "\n").encode())
            os.fsync(self._fd)
        except OSError as err:
            self._give_up_files(f"cannot append to the goodput ledger: {err}")

    def _where(self, at: float, batch: int, wct: float) -> dict[str, Any]:
        return {"at": at, "batch": batch, "wct": wct}

    def _write_beat(self, at: float) -> None:
        if self._beat is not None:
            BEAT.pack_into(self._beat, len(BEAT_MAGIC), self.n, self._batch, at, self._wct, self.n)

    # --- the loop --------------------------------------------------------------------------

    def batch_end(self, state: State, now: float) -> None:
        """After BATCH_END (``now``: its ``time.perf_counter()``): the step counts as
        committed when it advanced ``state.timestamp``'s batch count (a fault-tolerant
        strategy that does not commit a step leaves it)."""
        timestamp = state.timestamp
        if timestamp.batch == self._batch:
            return
        if self._checkpointer is not None and self._checkpointer.saved_at is not self._saved_at:
            self._checkpoint_saved()  # after the previous step
        self._batch, self._wct = timestamp.batch, timestamp.total_wct
        self._at = at = now + self._offset
        if self._beat is not None:
            BEAT.pack_into(self._beat, len(BEAT_MAGIC), self.n, self._batch, at, self._wct, self.n)
        if at >= self._due:
            self._due = at + RECORD_INTERVAL_S
            self._record(at)

    def _checkpoint_saved(self) -> None:
        # The Checkpointer saves at the checkpoint events, after the step it saves: seen at
        # the next step, the end of the fit or close, and recorded at that step's values.
        self._saved_at = saved_at = self._checkpointer.saved_at
        if saved_at is not None and saved_at[1] == self._batch:
            where = self._where(self._at, self._batch, self._wct)
            self._append({"event": "checkpoint", "n": self.n, **where})

    def _record(self, at: float) -> None:
        where = self._where(at, self._batch, self._wct)
        if self._first_step_done:
            self._append({"event": "progress", "n": self.n, **where})
            self._log()
            return
        self._first_step_done = True
        self.mark("compile" if self._compiled else "first_step")
        parts = self.parts()
        self._append({"event": "first_step", "n": self.n, **where, "parts": parts})
        restart = {f"goodput/restart_s/{name}": s for name, s in parts.items()}
        self._log({**restart, "goodput/restart_s/total": sum(parts.values())})

    def _log(self, extra: dict[str, float] | None = None) -> None:
        if self._logger is not None and self._logger.destinations:
            live = {
                "event": "beat",
                "n": self.n,
                **self._where(time.time(), self._batch, self._wct),
            }
            metrics = summarize([*self.records, live]).metrics()
            self._logger.log_metrics({**(extra or {}), **metrics})

    def fit_end(self, state: State) -> None:
        """The end of a ``fit``: a record, and the metrics."""
        if self._checkpointer is not None and self._checkpointer.saved_at is not self._saved_at:
            self._checkpoint_saved()
        self._batch, self._wct = state.timestamp.batch, state.timestamp.total_wct
        at = time.time()
        self._write_beat(at)
        self._append({"event": "progress", "n": self.n, **self._where(at, self._batch, self._wct)})
        self._log()

    def close(self) -> None:
        """The Trainer closes: the last record; the files are let go."""
        if self._logger is None:
            return  # never opened, or closed already
        if self._checkpointer is not None and self._checkpointer.saved_at is not self._saved_at:
            self._checkpoint_saved()  # the save at the end of the last fit
        at = time.time()
        self._write_beat(at)
        self._append({"event": "end", "n": self.n, **self._where(at, self._batch, self._wct)})
        self._close_files()
        self._logger = None
