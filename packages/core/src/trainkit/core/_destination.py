"""`LoggerDestination`: where logged values go (console, file, wandb, ...)."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from trainkit.core.config import Configurable

if TYPE_CHECKING:
    import torch

    from trainkit.core._logger import Logger
    from trainkit.core._state import State

__all__ = ["LoggerDestination"]


class LoggerDestination(Configurable):
    """Where logged values go (console, file, wandb, ...).

    Subclass it (its methods are no-ops) and override what you need; declare options with
    ``class MyDestination(LoggerDestination, config=MyConfig)``. Values in
    ``metrics`` may be 0-d tensors: convert them (``float(v)``) only when you write, so
    the training step never waits for the device because of logging. A destination that
    also wants loop events subclasses `Callback` too.
    """

    required_events: ClassVar[tuple[Any, ...]] = ()
    """Events the loop must fire for this destination to work (see `Algorithm`)."""

    needs_outputs: ClassVar[bool] = False
    """Set True if it reads ``state.outputs`` after AFTER_LOSS: the loop then keeps the
    model's outputs through backward and the optimizer step (see `Algorithm`)."""

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        """Record the run's configuration once."""

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record scalar values at ``step`` (the global batch count by default)."""

    def log_images(self, name: str, images: torch.Tensor | Sequence[Any], step: int) -> None:
        """Record images (NCHW / NHWC tensors or arrays)."""

    def log_table(
        self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int
    ) -> None:
        """Record a table: ``rows`` (lists of text or numbers, one value per column) under
        ``columns``, e.g. generated samples. Default: nothing (a destination that cannot
        show tables skips them; they are not turned into metrics)."""

    def upload_file(self, name: str, path: str | Path, overwrite: bool = False) -> None:
        """Copy a local file to wherever this destination keeps artifacts."""

    def upload_folder(self, name: str, path: str | Path, overwrite: bool = False) -> None:
        """Give the folder ``path`` (every regular file under it) to the destination as one
        artifact named ``name``, e.g. a checkpoint as ``"checkpoints/ep1-ba500"``.

        Default: `upload_file` for each of `folder_files`, named
        ``"<name>/<path inside the folder>"``. Override it where the destination keeps a
        folder as one artifact (and give it the same files).
        """
        for relative in self.folder_files(path):
            self.upload_file(f"{name}/{relative}", Path(path, relative), overwrite)

    @staticmethod
    def folder_files(path: str | Path) -> list[str]:
        """What `upload_folder` gives: the regular files under the folder ``path``, as sorted
        ``/``-separated paths relative to it. Links (to files or folders) are skipped, so
        nothing outside the folder is ever reached through one."""
        found = []
        for root, _, names in os.walk(path):  # does not descend into linked folders
            for file_name in names:
                full = os.path.join(root, file_name)
                if stat.S_ISREG(os.lstat(full).st_mode):
                    found.append(Path(os.path.relpath(full, path)).as_posix())
        return sorted(found)

    def log_traces(self, traces: Mapping[str, Any], step: int) -> None:
        """Record which algorithms ran at an event (``algorithm_traces/<name>/<event>``);
        sent only when the Trainer's ``log_traces`` is on. Default: as metrics."""
        self.log_metrics(traces, step)

    def close(self, state: State, logger: Logger) -> None:
        """Flush and release resources at the end of the run."""

    def post_close(self) -> None:
        """Called after every callback and destination has closed."""
