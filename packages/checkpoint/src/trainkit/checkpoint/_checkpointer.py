"""`Checkpointer`: save at an interval, keep the newest K, resume automatically."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainkit.checkpoint._commit import LATEST, TMP_PREFIX, interrupted_saves, remove_checkpoint
from trainkit.checkpoint._common import on_rank0
from trainkit.checkpoint._errors import CheckpointError, MissingAlgorithmError, StorageError
from trainkit.checkpoint._load import load_checkpoint, load_from
from trainkit.checkpoint._manifest import MANIFEST, Manifest
from trainkit.checkpoint._save import PendingSave, save_to
from trainkit.checkpoint._storage import Storage, is_url, join, location, open_storage
from trainkit.core import Callback, Event, Logger, State, Time, dist
from trainkit.core.interval import IntervalTrigger, interval_trigger

__all__ = ["Checkpointer", "CheckpointerConfig", "list_checkpoints"]


_NAME_FIELDS = ("epoch", "batch", "sample", "token", "batch_in_epoch")


@dataclass(kw_only=True)
class CheckpointerConfig:
    """The options of `Checkpointer` (and the ``checkpoint:`` section of a CLI config)."""

    folder: str
    """Where checkpoints go, one sub-folder each (``name_format``): a local folder or a URL
    (``"s3://bucket/prefix"``). A `pathlib.Path` is accepted and stored as a string."""
    interval: str | int | Time | IntervalTrigger = "1ep"
    """How often to save: a duration (``"1ep"``, ``"500ba"``, ``"0.1dur"``; an int counts
    epochs) or, from Python, a callable ``(state, event) -> bool``. The end of every
    ``fit`` is always saved."""
    keep: int = -1
    """How many checkpoints to keep (-1: all). The newest is never deleted."""
    autoresume: bool = False
    """Resume from the newest complete checkpoint in ``folder`` (start fresh if there is
    none); takes precedence over ``load_path``."""
    load_path: str | None = None
    """A checkpoint folder (local or a URL), or ``"latest"`` (the newest in ``folder``), to
    start the run from."""
    weights_only: bool = False
    """From ``load_path``, load only the model weights (e.g. to fine-tune)."""
    strict: bool = True
    """Parameter names must match the checkpoint's, and the run must have every algorithm
    the checkpoint needs (``required_on_load``); False skips both with a warning."""
    ignore_keys: list[str] = field(default_factory=list)
    """Glob patterns of entries not to load (``"model/head.*"``, ``"rng"``)."""
    async_save: bool = False
    """Return to training once the state is staged in host memory; the write, upload and
    commit finish in the background."""
    name_format: str = "ep{epoch}-ba{batch}"
    """Sub-folder name of each checkpoint; its fields are the `Timestamp`'s (``epoch``,
    ``batch``, ``sample``, ``token``, ``batch_in_epoch``)."""
    verify: bool = True
    """Check the sha256 of every file before loading (sizes are always checked)."""
    storage_options: dict[str, Any] | None = None
    """For a URL, options of its storage back end (for S3: ``endpoint_url``,
    ``region_name``, ...; see `S3Storage`)."""
    local_dir: str | None = None
    """For a URL, where checkpoints are staged before upload and downloaded before loading
    (default: a folder in the system's temporary directory)."""

    def __post_init__(self) -> None:
        self.folder = _path_text(self.folder, "folder")
        self.load_path = None if self.load_path is None else _path_text(self.load_path, "load_path")
        self.local_dir = None if self.local_dir is None else _path_text(self.local_dir, "local_dir")
        keep = self.keep
        if isinstance(keep, bool) or not isinstance(keep, int) or keep == 0 or keep < -1:
            raise ValueError(
                f"keep={keep!r} is not valid; use a positive number of checkpoints, or -1 to keep all"
            )
        interval_trigger(self.interval, at_end=False)  # raises naming the accepted forms
        try:
            example = self.name_format.format(**{name: 0 for name in _NAME_FIELDS})
            if "/" in example or "\\" in example or example.startswith("."):
                raise ValueError("a folder name cannot hold '/' or start with '.'")
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(
                f"name_format {self.name_format!r} is not valid ({err}); use fields like "
                "'{epoch}', '{batch}'"
            ) from err
        if isinstance(self.ignore_keys, str):
            raise TypeError(
                f"ignore_keys must be a list of patterns, got the string {self.ignore_keys!r}"
            )
        self.ignore_keys = list(self.ignore_keys)
        if self.storage_options is not None:
            self.storage_options = dict(self.storage_options)


def _path_text(value: Any, name: str) -> str:
    if isinstance(value, str | os.PathLike):
        return os.fspath(value)
    raise TypeError(f"{name} must be a path or a URL, got {type(value).__name__} {value!r}")


class Checkpointer(Callback, config=CheckpointerConfig):
    """Saves the run to ``folder`` and resumes it from there.

    ``Checkpointer(folder="runs/a", interval="500ba")`` and
    ``Checkpointer(CheckpointerConfig(folder="runs/a", interval="500ba"))`` are the same;
    see `CheckpointerConfig` for every option.
    """

    config: CheckpointerConfig

    # Loading happens at BEFORE_LOAD; saving at the checkpoint events and at FIT_END.
    required_events = (
        Event.BEFORE_LOAD,
        (Event.BATCH_CHECKPOINT, Event.EPOCH_CHECKPOINT),
        Event.FIT_END,
    )

    def __init__(self, config: CheckpointerConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        config = self.config
        self.storage: Storage = open_storage(config.folder, config.storage_options)
        self.folder = location(self.storage, "")
        self.trigger = interval_trigger(config.interval, at_end=False)
        self.pending: PendingSave | None = None
        self.saved_at: tuple[int, int] | None = None
        self.loaded_from: Path | str | None = None
        self._cleared = False

    # --- loading ---------------------------------------------------------------------------

    def before_load(self, state: State, logger: Logger) -> None:
        config = self.config
        if config.autoresume and (found := self._newest_loadable(state)) is not None:
            self.loaded_from = location(self.storage, found)
            self.saved_at = (state.timestamp.epoch, state.timestamp.batch)
            return
        if config.load_path is None:
            return
        options: dict[str, Any] = {
            "weights_only": config.weights_only,
            "strict": config.strict,
            "ignore_keys": config.ignore_keys,
            "verify": config.verify,
            "local_dir": config.local_dir,
        }
        if config.load_path == LATEST:
            load_from(self.storage, LATEST, state, **options)
            self.loaded_from = location(self.storage, LATEST)
        else:
            storage_options = config.storage_options if is_url(config.load_path) else None
            load_checkpoint(state, config.load_path, storage_options=storage_options, **options)
            self.loaded_from = config.load_path

    def _newest_loadable(self, state: State) -> str | None:
        config = self.config
        names = on_rank0(lambda: _complete(self.storage, newest_first=True, prefer_latest=True))
        for name in names:
            try:
                load_from(
                    self.storage,
                    name,
                    state,
                    strict=config.strict,
                    ignore_keys=config.ignore_keys,
                    verify=config.verify,
                    local_dir=config.local_dir,
                )
                return name
            except (StorageError, MissingAlgorithmError):
                # The storage failed, or the run lacks an algorithm: not this checkpoint's
                # fault, so never fall back to older ones (or silently start afresh).
                raise
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
        name = self.config.name_format.format(**state.timestamp.state_dict())
        if not self._cleared:
            on_rank0(self._clear_interrupted_saves)
            self._cleared = True
        self.pending = save_to(
            self.storage,
            name,
            state,
            async_save=self.config.async_save,
            local_dir=self.config.local_dir,
        )
        self.saved_at = (state.timestamp.epoch, state.timestamp.batch)
        if not self.config.async_save:
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
        if self.config.keep == -1 or dist.get_rank() != 0:
            return
        try:
            for old in _complete(self.storage, newest_first=True)[self.config.keep :]:
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
