"""`MemorySnapshot`: the CUDA allocator's history over chosen batches, as a snapshot and plots."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainkit.core import Callback, Logger, State
from trainkit.profiler._snapshot_files import (
    check_positive,
    cuda_run,
    resolve_folder,
    write_snapshot,
)

__all__ = ["MemorySnapshot", "MemorySnapshotConfig"]


@dataclass(kw_only=True)
class MemorySnapshotConfig:
    skip_batches: int = 1
    """Batches of the run before recording starts (the first one allocates the optimizer
    state and warms up kernels)."""
    record_batches: int = 3
    """Batches recorded; the snapshot is written at the end of the last of them (Composer's
    ``interval``)."""
    max_entries: int = 100_000
    """The most allocation and free events kept (older ones are dropped)."""
    folder: str | Path = "runs/{run_name}/memory"
    """Where the files go; ``{run_name}`` and ``{rank}`` are filled in when the run starts
    (a `Path` is kept as its text)."""
    upload: bool = False
    """Also give the files to the logger destinations (``upload_file``, as
    ``memory/<file>``)."""

    def __post_init__(self) -> None:
        self.folder = os.fspath(self.folder)
        check_positive("MemorySnapshot", "skip_batches", self.skip_batches, minimum=0)
        check_positive("MemorySnapshot", "record_batches", self.record_batches)
        check_positive("MemorySnapshot", "max_entries", self.max_entries)


class MemorySnapshot(Callback, config=MemorySnapshotConfig):
    """Records every CUDA allocation and free over ``record_batches`` batches, once.

    Recording starts at the batch after ``skip_batches`` batches of the run (counted by
    the run's batch number, so a resumed run that is already past it records nothing) and
    stops after ``record_batches`` batches, when each rank writes
    ``memory-batch{N}-rank{r}.pickle`` (open it in https://pytorch.org/memory_viz),
    ``...-trace.html`` (the allocator's timeline, every tensor with the stack that
    allocated it) and ``...-segments.html`` into ``folder``; N is the last recorded batch
    (or the last batch of training, when it ends first).
    On a run that is not on CUDA it does nothing and says so once, at info level.

    It drives ``torch.cuda.memory._record_memory_history``, as `OOMObserver` and the
    `Profiler`'s ``memory_timeline`` do: use one of them at a time. Options:
    `MemorySnapshotConfig`.
    """

    config: MemorySnapshotConfig

    def __init__(self, config: MemorySnapshotConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._enabled = False
        self._recording = False
        self._folder: Path | None = None
        self.files: list[Path] = []
        """The files written so far."""

    def init(self, state: State, logger: Logger) -> None:
        self._enabled = cuda_run("MemorySnapshot", state)
        if self._enabled:
            self._folder = resolve_folder("MemorySnapshot", str(self.config.folder), state)

    def batch_start(self, state: State, logger: Logger) -> None:
        if self._enabled and not self._recording and state.timestamp.batch == self._first:
            torch.cuda.memory._record_memory_history(
                max_entries=self.config.max_entries, stacks="python"
            )
            self._recording = True

    def batch_end(self, state: State, logger: Logger) -> None:
        if self._recording and state.timestamp.batch >= self._first + self.config.record_batches:
            self._write(state, logger)

    def fit_end(self, state: State, logger: Logger) -> None:
        if self._recording:  # training ended before the last recorded batch
            self._write(state, logger)

    @property
    def _first(self) -> int:
        return self.config.skip_batches  # batches done when the first recorded one starts

    def _write(self, state: State, logger: Logger) -> None:
        assert self._folder is not None
        stem = f"memory-batch{state.timestamp.batch}-rank{state.rank}"
        try:
            self.files += write_snapshot(
                self._folder, stem, logger=logger, upload=self.config.upload
            )
        finally:
            self._stop()
            self._enabled = False

    def close(self, state: State | None = None, logger: Logger | None = None) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._recording:
            torch.cuda.memory._record_memory_history(enabled=None)
            self._recording = False
