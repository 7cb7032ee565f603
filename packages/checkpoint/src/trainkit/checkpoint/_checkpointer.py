"""`Checkpointer`: save at an interval, keep the newest K, resume automatically."""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from trainkit.checkpoint._errors import CheckpointError
from trainkit.checkpoint._io import (
    LATEST,
    TMP_PREFIX,
    PendingSave,
    load_checkpoint,
    save_checkpoint,
)
from trainkit.checkpoint._manifest import MANIFEST, Manifest
from trainkit.core import Callback, Event, Logger, State, Time, dist, interval_trigger

__all__ = ["Checkpointer", "list_checkpoints"]


class Checkpointer(Callback):
    """Saves the run to ``folder`` and resumes it from there.

    Args:
        folder: where checkpoints go, one sub-folder each (``name_format``).
        interval: how often to save (``"1ep"``, ``"500ba"``, ``"0.1dur"``, or a callable
            ``(state, event) -> bool``); the end of every ``fit`` is always saved.
        keep: how many checkpoints to keep (-1: all). The newest is never deleted.
        autoresume: resume from the newest complete checkpoint in ``folder`` (start fresh
            if there is none); takes precedence over ``load_path``.
        load_path: a checkpoint folder, or ``"latest"`` (in ``folder``), to start from.
        weights_only: from ``load_path``, load only the model weights.
        strict: parameter names must match the checkpoint's.
        ignore_keys: glob patterns of entries not to load (``"model/head.*"``, ``"rng"``).
        async_save: return to training once the state is staged in host memory.
        name_format: sub-folder name; fields are the `Timestamp`'s (epoch, batch, ...).
        verify: check sha256 of every file before loading (sizes are always checked).
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        interval: Time | str | int | Callable[[State, Event], bool] = "1ep",
        keep: int = -1,
        autoresume: bool = False,
        load_path: str | os.PathLike[str] | None = None,
        weights_only: bool = False,
        strict: bool = True,
        ignore_keys: Sequence[str] = (),
        async_save: bool = False,
        name_format: str = "ep{epoch}-ba{batch}",
        verify: bool = True,
    ):
        if isinstance(keep, bool) or not isinstance(keep, int) or keep == 0 or keep < -1:
            raise ValueError(
                f"keep={keep!r} is not valid; use a positive number of checkpoints, or -1 to keep all"
            )
        try:
            name_format.format(
                **{f: 0 for f in ("epoch", "batch", "sample", "token", "batch_in_epoch")}
            )
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(
                f"name_format {name_format!r} is not valid ({err}); use fields like '{{epoch}}', '{{batch}}'"
            ) from err
        self.folder = Path(folder)
        self.trigger = interval_trigger(interval, at_end=False)
        self.keep, self.autoresume, self.async_save = keep, autoresume, async_save
        self.load_path = load_path
        self.weights_only, self.strict, self.ignore_keys = weights_only, strict, tuple(ignore_keys)
        self.name_format, self.verify = name_format, verify
        self.pending: PendingSave | None = None
        self.saved_at: tuple[int, int] | None = None
        self.loaded_from: Path | None = None

    # --- loading ---------------------------------------------------------------------------

    def before_load(self, state: State, logger: Logger) -> None:
        if self.autoresume and (found := self._newest_loadable(state)) is not None:
            self.loaded_from = found
            self.saved_at = (state.timestamp.epoch, state.timestamp.batch)
            return
        if self.load_path is not None:
            path = self.folder / LATEST if str(self.load_path) == "latest" else Path(self.load_path)
            load_checkpoint(
                state,
                path,
                weights_only=self.weights_only,
                strict=self.strict,
                ignore_keys=self.ignore_keys,
                verify=self.verify,
            )
            self.loaded_from = path

    def _newest_loadable(self, state: State) -> Path | None:
        for candidate in list_checkpoints(self.folder, newest_first=True, prefer_latest=True):
            try:
                load_checkpoint(
                    state,
                    candidate,
                    strict=self.strict,
                    ignore_keys=self.ignore_keys,
                    verify=self.verify,
                )
                return candidate
            except CheckpointError as err:
                warnings.warn(
                    f"cannot resume from {candidate} ({err}); trying the previous checkpoint",
                    stacklevel=2,
                )
        return None

    # --- saving ----------------------------------------------------------------------------

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        if self.trigger(state, Event.BATCH_END):
            self.save(state)

    def epoch_checkpoint(self, state: State, logger: Logger) -> None:
        if self.trigger(state, Event.EPOCH_END):
            self.save(state)

    def fit_end(self, state: State, logger: Logger) -> None:
        if self.saved_at != (state.timestamp.epoch, state.timestamp.batch):
            self.save(state)
        self.wait()

    def save(self, state: State) -> PendingSave:
        """Save now (after the previous save, if still running, has finished)."""
        self.wait()
        name = self.name_format.format(**state.timestamp.state_dict())
        if dist.get_rank() == 0:
            self.folder.mkdir(parents=True, exist_ok=True)
            _remove_interrupted_saves(self.folder)
        self.pending = save_checkpoint(state, self.folder / name, async_save=self.async_save)
        self.saved_at = (state.timestamp.epoch, state.timestamp.batch)
        if not self.async_save:
            self._rotate()
        return self.pending

    def wait(self) -> None:
        """Block until the save in flight (if any) is published; re-raise its error."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.wait()
            self._rotate()

    def _rotate(self) -> None:
        if self.keep == -1 or dist.get_rank() != 0:
            return
        for old in list_checkpoints(self.folder, newest_first=True)[self.keep :]:
            shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        self.wait()


def list_checkpoints(
    folder: str | os.PathLike[str], *, newest_first: bool = True, prefer_latest: bool = False
) -> list[Path]:
    """Complete checkpoints (with a readable manifest) in ``folder``, ordered by training time.

    With ``prefer_latest``, the one named by ``latest`` comes first when it is complete.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = []
    for child in folder.iterdir():
        if (
            child.is_dir()
            and not child.name.startswith(TMP_PREFIX)
            and (child / MANIFEST).is_file()
        ):
            try:
                batch = Manifest.read(child).timestamp.get("batch", 0)
            except CheckpointError:
                continue
            found.append((batch, child.stat().st_mtime, child))
    ordered = [path for *_, path in sorted(found, key=lambda item: item[:2], reverse=newest_first)]
    latest = folder / LATEST
    if prefer_latest and latest.is_file():
        named = folder / latest.read_text().strip()
        if named in ordered:
            ordered.remove(named)
            ordered.insert(0, named)
    return ordered


def _remove_interrupted_saves(folder: Path) -> None:
    # Only rank 0 saves' leftovers: a save is never in flight here (the previous one was awaited).
    for child in folder.iterdir():
        if child.name.startswith(TMP_PREFIX) and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
