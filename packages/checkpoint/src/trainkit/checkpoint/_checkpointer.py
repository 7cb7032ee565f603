"""`Checkpointer`: save at an interval, keep the newest K, resume automatically."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainkit.checkpoint._commit import LATEST, TMP_PREFIX, interrupted_saves, remove_checkpoint
from trainkit.checkpoint._common import on_rank0
from trainkit.checkpoint._errors import (
    CheckpointError,
    CheckpointExistsError,
    MissingAlgorithmError,
    StorageError,
)
from trainkit.checkpoint._load import load_checkpoint, load_from
from trainkit.checkpoint._manifest import MANIFEST, Manifest
from trainkit.checkpoint._names import (
    check_folder_template,
    check_name_format,
    fill_folder,
    format_name,
    has_fields,
)
from trainkit.checkpoint._save import PendingSave, save_to
from trainkit.checkpoint._select import check_ignore_keys, check_names
from trainkit.checkpoint._storage import Storage, is_url, join, location, open_storage
from trainkit.core import Callback, Event, Logger, State, Time, Timestamp, dist
from trainkit.core.interval import IntervalTrigger, interval_trigger

__all__ = ["Checkpointer", "CheckpointerConfig", "list_checkpoints"]


@dataclass(kw_only=True)
class CheckpointerConfig:
    """The options of `Checkpointer` (and the ``checkpoint:`` section of a CLI config)."""

    folder: str | None
    """Where checkpoints go, one sub-folder each (``name_format``): a local folder or a URL
    (``"s3://bucket/prefix"``). ``{run_name}`` (and ``{rank}``, ``{world_size}``, as in
    ``name_format``) are filled in when the run starts, e.g. ``"runs/{run_name}/checkpoints"``.
    A `pathlib.Path` is accepted and stored as a string. None: only load (from ``load_path``,
    which may then not be ``"latest"``), never save; ``autoresume`` needs a folder."""
    interval: str | int | Time | IntervalTrigger = "1ep"
    """How often to save: a duration (``"1ep"``, ``"500ba"``, ``"0.1dur"``; an int counts
    epochs) or, from Python, a callable ``(state, event) -> bool``. The end of every
    ``fit`` is always saved."""
    keep: int = -1
    """How many checkpoints to keep (-1: all). The newest is never deleted."""
    name_format: str = "ep{epoch}-ba{batch}"
    """Sub-folder name of each checkpoint. Fields: the `Timestamp`'s (``{epoch}``,
    ``{batch}``, ``{sample}``, ``{token}``, ``{batch_in_epoch}``, ``{sample_in_epoch}``,
    ``{token_in_epoch}``, and the wall-clock seconds ``{total_wct}``, ``{epoch_wct}``,
    ``{batch_wct}``, e.g. ``{total_wct:.0f}``), ``{run_name}``, ``{world_size}``, and
    ``{rank}`` (also ``{local_rank}``, ``{node_rank}``), which is always 0: one checkpoint
    is one folder holding every rank's shards, published by rank 0, so its name is rank 0's
    and ranks can never write different folders (Composer fills in each rank's number, but
    there too only rank 0 writes a file, or a sharded save's shared folder). The name is
    formatted on rank 0 and sent to the others. A trailing ``.pt`` (Composer's
    ``"ep{epoch}-ba{batch}-rank{rank}.pt"``) is dropped, giving the folder
    ``ep1-ba42-rank0``: a checkpoint is a folder, never one ``torch.save`` file; archive and
    compressed suffixes (``.tar.gz``, ``.pt.zst``, ...) are refused."""
    overwrite: bool = False
    """Replace a checkpoint (or anything) already at a save's name: atomically on a file
    system (the old folder is swapped out in one step), by removing the old one first on an
    object store. Without it such a save raises `CheckpointExistsError` before anything is
    written, and, at the first ``fit``, so does a folder holding checkpoints this run would
    save over later (as Composer's ``save_overwrite=False``). With ``autoresume``, the
    checkpoints newer than the one the run resumed from (its lost progress, e.g. after a
    crash before ``latest`` was updated) are replaced without it."""
    save_weights_only: bool = False
    """Save only the model weights (smaller; a run cannot resume from them, so this does
    not go with ``autoresume``, but another can start from them with
    ``load_weights_only=True``)."""
    async_save: bool = False
    """Return to training once the state is staged in host memory; the write, upload and
    commit finish in the background."""
    autoresume: bool = False
    """Resume from the newest complete checkpoint in ``folder`` (start fresh, or from
    ``load_path``, if there is none), restoring everything: ``load_weights_only``,
    ``ignore_keys`` and ``exclude_algorithms`` apply to ``load_path`` only, as in Composer.
    Takes precedence over ``load_path``; with a ``{run_name}`` folder, give the run a fixed
    ``run_name``."""
    load_path: str | None = None
    """What to start the run from: a checkpoint folder (local or a URL), ``"latest"`` (the
    newest in ``folder``), or a ``.pt`` file Composer saved (local or a URL; read with
    ``torch.load(weights_only=True)``, never running code from it): model weights mapped to
    the model's names, and unless ``load_weights_only`` its optimizer state, time and
    random generators (see `load_torch_file`). ``{run_name}`` and ``{rank}`` (0: Composer's
    rank-0 file) are filled in."""
    load_weights_only: bool = False
    """From ``load_path``, load only the model weights (e.g. to fine-tune); the run starts
    at batch 0 with fresh optimizers."""
    strict: bool = True
    """Parameter names must match the checkpoint's, and the run must have every algorithm
    the checkpoint needs (``required_on_load``); False skips both with a warning. (Composer's
    ``load_strict_model_weights`` defaults to False and covers the names only.)"""
    ignore_keys: list[str] | Callable[[dict[str, Any]], None] = field(default_factory=list)
    """What not to load from ``load_path``: glob patterns of entries (``"model/head.*"``,
    ``"rng"``, ``"optimizers"``; Composer's ``"state/model/head.*"`` works too), which keep
    the run's own values; or, from Python only, a callable ``(state_dict) -> None`` that
    edits the loaded state in place before it is put into the run, as Composer's: for a
    trainkit checkpoint it gets ``{"state": {"model": ..., "optimizers": [...], ...}}``, for a
    Composer ``.pt`` Composer's own dict."""
    exclude_algorithms: list[str] = field(default_factory=list)
    """Algorithm class names (``"BlurPool"``) whose saved state is not loaded from
    ``load_path``, and which the run need not have even where the checkpoint requires them
    (``required_on_load``), as Composer's ``load_exclude_algorithms``: to take weights from a
    run with surgery into one without (layers that do not fit then need ``strict=False``)."""
    verify: bool = True
    """Check the sha256 of every file before loading (sizes are always checked)."""
    storage_options: dict[str, Any] | None = None
    """For a URL, options of its storage back end (for S3: ``endpoint_url``,
    ``region_name``, ...; see `S3Storage`)."""
    local_dir: str | None = None
    """For a URL, where checkpoints are staged before upload and downloaded before loading
    (default: a folder in the system's temporary directory)."""

    def __post_init__(self) -> None:
        self.folder = None if self.folder is None else _path_text(self.folder, "folder")
        self.load_path = None if self.load_path is None else _path_text(self.load_path, "load_path")
        self.local_dir = None if self.local_dir is None else _path_text(self.local_dir, "local_dir")
        keep = self.keep
        if isinstance(keep, bool) or not isinstance(keep, int) or keep == 0 or keep < -1:
            raise ValueError(
                f"keep={keep!r} is not valid; use a positive number of checkpoints, or -1 to keep all"
            )
        interval_trigger(self.interval, at_end=False)  # raises naming the accepted forms
        check_name_format(self.name_format)
        if self.folder is None and (self.autoresume or self.load_path == LATEST):
            raise ValueError(
                f"{'autoresume=True' if self.autoresume else 'load_path=latest'} looks for "
                "checkpoints in folder, and folder is None; give the folder"
            )
        if self.folder is not None:
            check_folder_template(self.folder)
        if self.load_path is not None:
            check_folder_template(self.load_path)
        self.ignore_keys = check_ignore_keys(self.ignore_keys)
        self.exclude_algorithms = check_names(
            self.exclude_algorithms, "exclude_algorithms", "algorithm class names"
        )
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
        if "weights_only" in options:
            raise TypeError(
                "Checkpointer has no option 'weights_only': use load_weights_only=True to load "
                "only the weights from load_path, or save_weights_only=True to save only them"
            )
        super().__init__(config, **options)
        config = self.config
        self.trigger = interval_trigger(config.interval, at_end=False)
        self.storage: Storage | None = None
        self.folder: Path | str | None = None  # set when the run starts if folder has fields
        if config.folder is not None and not has_fields(config.folder):
            self._open_folder(config.folder)
        self.pending: PendingSave | None = None
        self.saved_at: tuple[int, int] | None = None
        self.loaded_from: Path | str | None = None
        self._cleared = False
        self._checked_existing = False
        self._replaceable: frozenset[str] = frozenset()

    def _open_folder(self, folder: str) -> Storage:
        self.storage = open_storage(folder, self.config.storage_options)
        self.folder = location(self.storage, "")
        return self.storage

    def _storage_for(self, state: State) -> Storage:
        if self.storage is not None:
            return self.storage
        if self.config.folder is None:
            raise ValueError("this Checkpointer has no folder (folder=None): it only loads")
        world = dist.get_world_size()
        return self._open_folder(
            fill_folder(self.config.folder, run_name=state.run_name, world_size=world)
        )

    def _name(self, state: State) -> str:
        return format_name(
            self.config.name_format,
            timestamp=state.timestamp,
            run_name=state.run_name,
            world_size=dist.get_world_size(),
        )

    # --- loading ---------------------------------------------------------------------------

    def before_load(self, state: State, logger: Logger) -> None:
        config = self.config
        if config.folder is not None:
            self._storage_for(state)
            self._name(state)  # a run_name that cannot name a folder fails here, not later
        if config.autoresume and config.save_weights_only:
            # Checked here rather than in the config, which takes each field on its own.
            raise ValueError(
                "autoresume=True needs full checkpoints, but save_weights_only=True saves only "
                "the model weights, from which a run cannot resume; drop one of them"
            )
        if config.autoresume:
            found = self._newest_loadable(state)
            self._replaceable = frozenset(on_rank0(lambda: self._newer_than(state.timestamp)))
            if found is not None:
                self.loaded_from = location(self._storage_for(state), found)
                self.saved_at = (state.timestamp.epoch, state.timestamp.batch)
                return
        if config.load_path is None:
            return
        path = fill_folder(
            config.load_path, run_name=state.run_name, world_size=dist.get_world_size()
        )
        options: dict[str, Any] = {
            "weights_only": config.load_weights_only,
            "strict": config.strict,
            "ignore_keys": config.ignore_keys,
            "exclude_algorithms": config.exclude_algorithms,
            "verify": config.verify,
            "local_dir": config.local_dir,
        }
        if path == LATEST:
            storage = self._storage_for(state)
            load_from(storage, LATEST, state, **options)
            self.loaded_from = location(storage, LATEST)
        else:
            storage_options = config.storage_options if is_url(path) else None
            load_checkpoint(state, path, storage_options=storage_options, **options)
            self.loaded_from = path

    def _newest_loadable(self, state: State) -> str | None:
        config, storage = self.config, self._storage_for(state)
        names = on_rank0(lambda: _complete(storage, newest_first=True, prefer_latest=True))
        for name in names:
            try:
                load_from(
                    storage,
                    name,
                    state,
                    strict=config.strict,
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
                    f"cannot resume from {location(storage, name)} ({err}); "
                    "trying the previous checkpoint",
                    stacklevel=2,
                )
        return None

    def _newer_than(self, timestamp: Timestamp) -> list[str]:
        """Rank 0: the complete checkpoints saved after ``timestamp`` (by batch)."""
        assert self.storage is not None, "opened in before_load"
        return [
            name
            for name, manifest in _manifests(self.storage)
            if manifest.timestamp.get("batch", 0) > timestamp.batch
        ]

    # --- saving ----------------------------------------------------------------------------

    def fit_start(self, state: State, logger: Logger) -> None:
        saves = self.config.folder is not None
        if saves and not self.config.overwrite and not self._checked_existing:
            self._storage_for(state)
            on_rank0(lambda: self._refuse_future_collisions(state))
        self._checked_existing = True

    def _refuse_future_collisions(self, state: State) -> None:
        """Rank 0: raise if the folder holds checkpoints from later in training that this
        run would save over (the same name at the same point), as Composer checks."""
        assert self.storage is not None, "opened in before_load"
        clashes = []
        for name, manifest in _manifests(self.storage):
            if manifest.timestamp.get("batch", 0) <= state.timestamp.batch:
                continue
            try:
                then = Timestamp.from_state_dict(manifest.timestamp)
                again = format_name(
                    self.config.name_format,
                    timestamp=then,
                    run_name=state.run_name,
                    world_size=dist.get_world_size(),
                )
            except (ValueError, TypeError, KeyError):
                continue
            if again == name and name not in self._replaceable:
                clashes.append(f"{name} (batch {then.batch})")
        if clashes:
            raise CheckpointExistsError(
                f"{self.folder} already holds checkpoints from later in training that this run "
                f"(now at batch {state.timestamp.batch}) would save over: {', '.join(clashes[:5])}"
                f"{' ...' if len(clashes) > 5 else ''}. Use another folder, delete them, resume "
                "the run that wrote them (autoresume=True), or allow replacing them with "
                "overwrite=True (the Trainer's save_overwrite=True)"
            )

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        if self.config.folder is not None and self.trigger(state, Event.BATCH_END):
            self.save(state)

    def epoch_checkpoint(self, state: State, logger: Logger) -> None:
        if self.config.folder is not None and self.trigger(state, Event.EPOCH_END):
            self.save(state)

    def fit_end(self, state: State, logger: Logger) -> None:
        at = (state.timestamp.epoch, state.timestamp.batch)
        if self.config.folder is not None and self.saved_at != at:
            self.save(state)
        self.wait()

    def save(self, state: State) -> PendingSave:
        """Save now (after the previous save, if still running, has finished)."""
        self.wait()
        storage = self._storage_for(state)
        if not self._cleared:
            on_rank0(self._clear_interrupted_saves)
            self._cleared = True
        # Named on rank 0: wall-clock fields differ between ranks, the folder must not.
        name = on_rank0(lambda: self._name(state))
        self.pending = save_to(
            storage,
            name,
            state,
            weights_only=self.config.save_weights_only,
            overwrite=self.config.overwrite or name in self._replaceable,
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
        assert self.storage is not None, "opened before the first save"
        for folder in interrupted_saves(self.storage):
            remove_checkpoint(self.storage, folder)

    def wait(self) -> None:
        """Block until the save in flight (if any) is published; re-raise its error."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.wait()
            self._rotate()

    def _rotate(self) -> None:
        if self.config.keep == -1 or dist.get_rank() != 0 or self.storage is None:
            return
        try:
            for old in _complete(self.storage, newest_first=True)[self.config.keep :]:
                remove_checkpoint(self.storage, old)
        except CheckpointError as err:
            # Training goes on; the next rotation tries again.
            warnings.warn(f"could not remove old checkpoints: {err}", stacklevel=2)

    def close(self, state: State | None = None, logger: Logger | None = None) -> None:
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


def _manifests(storage: Storage) -> list[tuple[str, Manifest]]:
    """Every complete checkpoint (with a readable manifest) in ``storage``, by name."""
    found = []
    for name in storage.list_folders():
        if name.startswith(TMP_PREFIX):
            continue
        try:
            data = storage.read_bytes(join(name, MANIFEST))
        except (FileNotFoundError, IsADirectoryError):
            continue  # not a checkpoint, or an interrupted save
        try:
            found.append((name, Manifest.parse(data, f"{location(storage, name)}/{MANIFEST}")))
        except CheckpointError:
            continue
    return found


def _complete(storage: Storage, *, newest_first: bool, prefer_latest: bool = False) -> list[str]:
    found = [
        (manifest.timestamp.get("batch", 0), manifest.created, name)
        for name, manifest in _manifests(storage)
    ]
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
