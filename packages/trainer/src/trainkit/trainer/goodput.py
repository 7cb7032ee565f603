"""Goodput: how much of a run's wall-clock time went into training that the run kept.

Every `Trainer` keeps a ledger of the processes that trained its run, ``goodput.jsonl``,
in the run's checkpoint folder (rank 0 writes it; one JSON object per line, appended and
fsynced), and logs what it adds up to as ``goodput/...`` metrics (docs/goodput.md). This
module reads a ledger and sums it up, e.g. after a run::

    summary = read_ledger("runs/default/checkpoints")
    print(f"{summary.fraction:.1%}, {summary.lost_steps} steps lost, {summary.restarts} restarts")

Each record has an ``"event"`` and ``"n"``, the number of the process it is about:

- ``start``: a process is ready to train (loaded): ``started`` (when the process began),
  ``batch`` and ``wct`` (the run's batch count and training time it starts from),
  ``resumed_from``, ``run`` (the run's name), ``parts`` (its restart time so far, by part);
- ``first_step``: its first committed step, with the ``compile`` or ``first_step`` part;
- ``checkpoint``: the run's `Checkpointer` saved (or began an asynchronous save) after the
  step it names;
- ``progress`` (every minute and at the end of each ``fit``), ``end`` (the Trainer closed);
- ``beat``: the last step a process committed, read from the heartbeat file
  (``goodput.beat``, written at every step into a shared memory page, no system call) by
  the next process: a process killed with SIGKILL writes nothing of its own at the end.

``at`` is ``time.time()`` when the record was true; ``batch`` and ``wct`` are always the
run's `Timestamp` then (``wct``: its ``total_wct``, the training time of the steps that led
there, restored from the checkpoint on resume).
"""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "HEARTBEAT",
    "LEDGER",
    "GoodputSummary",
    "ProcessSummary",
    "read_heartbeat",
    "read_ledger",
    "read_records",
    "summarize",
]

LEDGER = "goodput.jsonl"
"""The ledger's file name, in the run's checkpoint folder."""
HEARTBEAT = "goodput.beat"
"""The heartbeat's file name, beside the ledger."""

# The heartbeat: a magic, then (process n, batch, at, wct, process n again): a beat torn by
# a kill between its stores has two different numbers and is ignored.
BEAT_MAGIC = b"TKGPBEAT"
BEAT = struct.Struct("<qqddq")
BEAT_SIZE = len(BEAT_MAGIC) + BEAT.size


@dataclass(frozen=True, kw_only=True)
class ProcessSummary:
    """One process's part in the run, from its records."""

    n: int
    started: float
    """``time.time()`` when the process began (or its Trainer, for a later one in a process)."""
    last_at: float
    """``time.time()`` of its last record or heartbeat."""
    first_batch: int
    last_batch: int
    first_wct: float
    last_wct: float
    resumed_from: str | None
    restart_s: dict[str, float]
    """Its restart time by part (``import``, ``setup``, ``rendezvous``, ``prepare``,
    ``load``, then ``compile`` or ``first_step``): what is known of them."""

    @property
    def wall_s(self) -> float:
        return max(0.0, self.last_at - self.started)

    @property
    def committed_s(self) -> float:
        """Training time of the steps it committed (some may be lost later)."""
        return max(0.0, self.last_wct - self.first_wct)


@dataclass(frozen=True, kw_only=True)
class GoodputSummary:
    """What a ledger adds up to."""

    fraction: float
    """``train_s / wall_s``: the share of the processes' wall-clock time spent in steps
    that the run kept (0.0 when no time has passed)."""
    train_s: float
    """Training time of the committed steps that were not lost (the `Timestamp`'s measure
    of a step: from the end of the one before, so loading its batch, its events and a
    checkpoint saved after the previous step count; evaluation does not)."""
    wall_s: float
    """The processes' wall-clock time, each from its start to its last record or heartbeat
    (the time between processes, e.g. waiting for a restart, is not counted)."""
    lost_steps: int
    """Steps trained after the checkpoint a later process resumed from: trained again."""
    lost_s: float
    """Their training time."""
    restarts: int
    """Processes after the first one."""
    processes: tuple[ProcessSummary, ...] = field(default=())

    def metrics(self) -> dict[str, float]:
        """The ``goodput/...`` metrics the Trainer logs for this summary."""
        return {
            "goodput/fraction": self.fraction,
            "goodput/train_s": self.train_s,
            "goodput/wall_s": self.wall_s,
            "goodput/lost_steps": self.lost_steps,
            "goodput/lost_s": self.lost_s,
            "goodput/restarts": self.restarts,
        }


def summarize(records: Iterable[Mapping[str, Any]]) -> GoodputSummary:
    """Add up ledger records (in the order written) since the run's first process.

    A process that loaded nothing under another run name than the process before it
    starts a new run in the same folder: only the records from there on count.
    """
    records = list(records)
    processes: dict[int, dict[str, Any]] = {}
    previous_run: str | None = None
    for record in records:
        event, n = record.get("event"), record.get("n")
        if event == "start":
            run = record.get("run")
            if record.get("resumed_from") is None and processes and run != previous_run:
                processes = {}  # another run, started afresh in this folder
            previous_run = run
            processes[n] = {**record, "first": record, "last": record}
        elif n in processes:
            kept = processes[n]
            if record.get("at", 0.0) >= kept["last"].get("at", 0.0):
                kept["last"] = record
            if "parts" in record:
                kept["parts"] = {**kept.get("parts", {}), **record["parts"]}
    summaries = tuple(_process(n, kept) for n, kept in processes.items())
    lost_steps, lost_s = 0, 0.0
    for before, after in itertools.pairwise(summaries):
        lost_steps += max(0, before.last_batch - after.first_batch)
        lost_s += max(0.0, before.last_wct - after.first_wct)
    train_s = max(0.0, sum(p.committed_s for p in summaries) - lost_s)
    wall_s = sum(p.wall_s for p in summaries)
    return GoodputSummary(
        fraction=train_s / wall_s if wall_s > 0 else 0.0,
        train_s=train_s,
        wall_s=wall_s,
        lost_steps=lost_steps,
        lost_s=lost_s,
        restarts=max(0, len(summaries) - 1),
        processes=summaries,
    )


def _process(n: int, kept: Mapping[str, Any]) -> ProcessSummary:
    first, last = kept["first"], kept["last"]
    return ProcessSummary(
        n=n,
        started=float(first.get("started", first["at"])),
        last_at=float(last["at"]),
        first_batch=int(first["batch"]),
        last_batch=int(last["batch"]),
        first_wct=float(first["wct"]),
        last_wct=float(last["wct"]),
        resumed_from=first.get("resumed_from"),
        restart_s=dict(kept.get("parts", {})),
    )


def read_records(folder: str | Path) -> list[dict[str, Any]]:
    """The ledger's records in ``folder``, then its heartbeat's last beat (a line cut short
    by a crash is skipped).

    Raises:
        FileNotFoundError: ``folder`` holds no ledger.
    """
    path = Path(folder) / LEDGER
    if not path.is_file():
        raise FileNotFoundError(
            f"no goodput ledger {str(path)!r}; give the checkpoint folder of a run trained "
            "by the Trainer (it holds goodput.jsonl)"
        )
    records = parse_lines(path.read_bytes())
    beat = read_heartbeat(Path(folder) / HEARTBEAT)
    return records if beat is None else [*records, beat]


def read_ledger(folder: str | Path) -> GoodputSummary:
    """`summarize` the ledger in ``folder`` (the run's checkpoint folder), heartbeat included."""
    return summarize(read_records(folder))


def parse_lines(data: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a ledger's bytes, skipping any line that is not one."""
    records = []
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def read_heartbeat(path: str | Path) -> dict[str, Any] | None:
    """The beat in a heartbeat file, as a ``beat`` record (None: no file, or no whole beat)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    return decode_beat(data)


def decode_beat(data: bytes) -> dict[str, Any] | None:
    if len(data) < BEAT_SIZE or not data.startswith(BEAT_MAGIC):
        return None
    n, batch, at, wct, again = BEAT.unpack_from(data, len(BEAT_MAGIC))
    if n != again or n < 0:
        return None
    return {"event": "beat", "n": n, "at": at, "batch": batch, "wct": wct}
