"""`Checkpointer`: save at an interval, keep the newest K, resume automatically."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trainkit.checkpoint._commit import LATEST, TMP_PREFIX, interrupted_saves, remove_checkpoint
from trainkit.checkpoint._common import on_rank0
from trainkit.checkpoint._errors import CheckpointError, StorageError
from trainkit.checkpoint._load import load_checkpoint, load_from
from trainkit.checkpoint._manifest import MANIFEST, Manifest
from trainkit.checkpoint._save import PendingSave, save_to
from trainkit.checkpoint._storage import Storage, is_url, join, location, open_storage
from trainkit.core import Callback, Event, Logger, State, Time, dist, interval_trigger

__all__ = ["Checkpointer", "list_checkpoints"]


class Checkpointer(Callback):
    """Saves the run to ``folder`` and resumes it from there.

    Args:
        folder: where checkpoints go, one sub-folder each (``name_format``): a local folder
            or a URL (``"s3://bucket/prefix"``).
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
        storage_options: for a URL, options of its storage back end (for S3:
            ``endpoint_url``, ``region_name``, ...; see `S3Storage`).
        local_dir: for a URL, where checkpoints are staged before upload and downloaded
            before loading (default: a folder in the system's temporary directory).
    """

    # Loading happens at BEFORE_LOAD; saving at the checkpoint events and at FIT_END.
    required_events = (
        Event.BEFORE_LOAD,
        (Event.BATCH_CHECKPOINT, Event.EPOCH_CHECKPOINT),
        Event.FIT_END,
    )

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
        storage_options: Mapping[str, Any] | None = None,
        local_dir: str | os.PathLike[str] | None = None,
    ):
        if isinstance(keep, bool) or not isinstance(keep, int) or keep == 0 or keep < -1:
            raise ValueError(
                f"keep={keep!r} is not valid; use a positive number of checkpoints, or -1 to keep all"
            )
        try:
            example = name_format.format(
                **{f: 0 for f in ("epoch", "batch", "sample", "token", "batch_in_epoch")}
            )
            if "/" in example or "\\" in example or example.startswith("."):
                raise ValueError("a folder name cannot hold '/' or start with '.'")
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(
                f"name_format {name_format!r} is not valid ({err}); use fields like '{{epoch}}', '{{batch}}'"
            ) from err
        self.storage: Storage = open_storage(folder, storage_options)
        self.folder = location(self.storage, "")
        self.storage_options, self.local_dir = storage_options, local_dir
        self.trigger = interval_trigger(interval, at_end=False)
        self.keep, self.autoresume, self.async_save = keep, autoresume, async_save
        self.load_path = load_path
        self.weights_only, self.strict, self.ignore_keys = weights_only, strict, tuple(ignore_keys)
        self.name_format, self.verify = name_format, verify
        self.pending: PendingSave | None = None
        self.saved_at: tuple[int, int] | None = None
        self.loaded_from: Path | str | None = None
        self._cleared = False

    # --- loading ---------------------------------------------------------------------------

    def before_load(self, state: State, logger: Logger) -> None:
        if self.autoresume and (found := self._newest_loadable(state)) is not None:
            self.loaded_from = location(self.storage, found)
            self.saved_at = (state.timestamp.epoch, state.timestamp.batch)
            return
        if self.load_path is None:
            return
        options: dict[str, Any] = {
            "weights_only": self.weights_only,
            "strict": self.strict,
            "ignore_keys": self.ignore_keys,
            "verify": self.verify,
            "local_dir": self.local_dir,
        }
        if str(self.load_path) == LATEST:
            load_from(self.storage, LATEST, state, **options)
            self.loaded_from = location(self.storage, LATEST)
        else:
            storage_options = self.storage_options if is_url(self.load_path) else None
            load_checkpoint(state, self.load_path, storage_options=storage_options, **options)
            self.loaded_from = self.load_path

    def _newest_loadable(self, state: State) -> str | None:
        names = on_rank0(lambda: _complete(self.storage, newest_first=True, prefer_latest=True))
        for name in names:
            try:
                load_from(
                    self.storage,
                    name,
                    state,
                    strict=self.strict,
                    ignore_keys=self.ignore_keys,
                    verify=self.verify,
                    local_dir=self.local_dir,
                )
                return name
            except StorageError:
                raise  # the storage failed, not this checkpoint: never fall back to older ones
            except CheckpointError as err:
                warnings.warn(
                    f"cannot resume from {location(self.storage, name)} ({err}); "
                    "trying the previous checkpoint",
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
        if not self._cleared:
            on_rank0(self._clear_interrupted_saves)
            self._cleared = True
        self.pending = save_to(
            self.storage, name, state, async_save=self.async_save, local_dir=self.local_dir
        )
        self.saved_at = (state.timestamp.epoch, state.timestamp.batch)
        if not self.async_save:
            self._rotate()
        return self.pending

    def _clear_interrupted_saves(self) -> None:
        # What saves of an earlier, interrupted run left behind. Later saves of this run
        # never leave any: each is awaited (and fails loudly) before the next starts.
        for folder in interrupted_saves(self.storage):
            remove_checkpoint(self.storage, folder)

    def wait(self) -> None:
        """Block until the save in flight (if any) is published; re-raise its error."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.wait()
            self._rotate()

    def _rotate(self) -> None:
        if self.keep == -1 or dist.get_rank() != 0:
            return
        try:
            for old in _complete(self.storage, newest_first=True)[self.keep :]:
                remove_checkpoint(self.storage, old)
        except CheckpointError as err:
            # Training goes on; the next rotation tries again.
            warnings.warn(f"could not remove old checkpoints: {err}", stacklevel=2)

    def close(self) -> None:
        self.wait()


def list_checkpoints(
    folder: str | os.PathLike[str],
    *,
    newest_first: bool = True,
    prefer_latest: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> list[Path] | list[str]:
    """Complete checkpoints (with a readable manifest) in ``folder``, ordered by training time.

    With ``prefer_latest``, the one named by ``latest`` comes first when it is complete.
    Local folders give paths; URLs (``"s3://bucket/prefix"``) give URLs.
    """
    storage = open_storage(folder, storage_options)
    names = _complete(storage, newest_first=newest_first, prefer_latest=prefer_latest)
    return [location(storage, name) for name in names]  # type: ignore[return-value]


def _complete(storage: Storage, *, newest_first: bool, prefer_latest: bool = False) -> list[str]:
    found = []
    for name in storage.list_folders():
        if name.startswith(TMP_PREFIX):
            continue
        try:
            data = storage.read_bytes(join(name, MANIFEST))
        except (FileNotFoundError, IsADirectoryError):
            continue  # not a checkpoint, or an interrupted save
        try:
            manifest = Manifest.parse(data, f"{location(storage, name)}/{MANIFEST}")
        except CheckpointError:
            continue
        found.append((manifest.timestamp.get("batch", 0), manifest.created, name))
    ordered = [name for *_, name in sorted(found, reverse=newest_first)]
    if prefer_latest:
        try:
            named = storage.read_bytes(LATEST).decode().strip()
        except (FileNotFoundError, IsADirectoryError, UnicodeDecodeError):
            named = ""
        if named in ordered:
            ordered.remove(named)
            ordered.insert(0, named)
    return ordered
