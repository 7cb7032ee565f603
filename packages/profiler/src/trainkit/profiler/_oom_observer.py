"""`OOMObserver`: on a CUDA out-of-memory error, the allocator's recent history and plots."""

from __future__ import annotations

import logging
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

__all__ = ["OOMObserver", "OOMObserverConfig"]

log = logging.getLogger("trainkit.profiler")


@dataclass(kw_only=True)
class OOMObserverConfig:
    max_entries: int = 100_000
    """The most recent allocation and free events kept for the snapshot."""
    folder: str | Path = "runs/{run_name}/memory"
    """Where the files go; ``{run_name}`` and ``{rank}`` are filled in when the run starts
    (a `Path` is kept as its text)."""
    upload: bool = False
    """Also give the files to the logger destinations (``upload_file``, as
    ``memory/<file>``)."""

    def __post_init__(self) -> None:
        self.folder = os.fspath(self.folder)
        check_positive("OOMObserver", "max_entries", self.max_entries)


class OOMObserver(Callback, config=OOMObserverConfig):
    """Writes the CUDA allocator's state when it runs out of memory, before anything is freed.

    From `Event.INIT` the allocator keeps its last ``max_entries`` allocation and free
    events (with their Python stacks); an observer registered with the allocator runs when
    it is about to raise ``torch.OutOfMemoryError``, and writes
    ``oom-batch{N}-rank{r}.pickle`` (open it in https://pytorch.org/memory_viz),
    ``...-trace.html`` (the timeline up to the failure) and ``...-segments.html`` into
    ``folder``, N being the batch that ran out (batches counted from 1, as logged steps).
    Once per batch: the retries of ``device_train_microbatch_size="auto"`` at the same
    batch write nothing more. The error itself goes on as before (and auto-microbatching
    may still recover from it). On a run that is not on CUDA it does nothing and says so
    once, at info level.

    Recording costs a little on every allocation (a Python stack is kept). It drives
    ``torch.cuda.memory._record_memory_history``, as `MemorySnapshot` and the `Profiler`'s
    ``memory_timeline`` do: use one of them at a time. Options: `OOMObserverConfig`.
    """

    config: OOMObserverConfig

    def __init__(self, config: OOMObserverConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._active = False
        self._state: State | None = None
        self._logger: Logger | None = None
        self._folder: Path | None = None
        self._written: set[int] = set()
        self.files: list[Path] = []
        """The files written so far."""

    def init(self, state: State, logger: Logger) -> None:
        if not cuda_run("OOMObserver", state):
            return
        self._state, self._logger = state, logger
        self._folder = resolve_folder("OOMObserver", str(self.config.folder), state)
        torch.cuda.memory._record_memory_history(
            max_entries=self.config.max_entries, stacks="python"
        )
        # The allocator keeps its observers for the life of the process: `close` only
        # turns this one off.
        torch._C._cuda_attach_out_of_memory_observer(self._observe)
        self._active = True

    def _observe(self, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        if not self._active or self._state is None or self._folder is None:
            return
        batch = self._state.timestamp.batch + 1  # the batch being run
        if batch in self._written:
            return
        self._written.add(batch)
        log.warning(
            "CUDA out of memory on device %d (asked for %d bytes, %d allocated, %d free); "
            "writing the allocator's snapshot",
            device,
            alloc,
            device_allocated,
            device_free,
        )
        stem = f"oom-batch{batch}-rank{self._state.rank}"
        try:
            self.files += write_snapshot(
                self._folder, stem, logger=self._logger, upload=self.config.upload
            )
        except Exception:  # inside the allocator: never replace the out-of-memory error
            log.exception("OOMObserver could not write the memory snapshot")

    def close(self, state: State | None = None, logger: Logger | None = None) -> None:
        if self._active:
            self._active = False
            torch.cuda.memory._record_memory_history(enabled=None)
