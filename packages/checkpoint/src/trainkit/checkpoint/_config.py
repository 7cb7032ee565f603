"""`CheckpointerConfig`: every option of the `Checkpointer`, declared once."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trainkit.checkpoint._commit import LATEST
from trainkit.checkpoint._manifest import check_checksum
from trainkit.checkpoint._names import check_folder_template, check_name_format
from trainkit.checkpoint._select import check_ignore_keys, check_names
from trainkit.checkpoint._storage import is_url
from trainkit.core import Time
from trainkit.core.config import primary
from trainkit.core.interval import IntervalTrigger, interval_trigger

__all__ = ["CheckpointerConfig"]


@dataclass(kw_only=True)
class CheckpointerConfig:
    """The options of `Checkpointer` (and the ``checkpoint:`` section of a CLI config)."""

    unknown_field_hints: ClassVar[dict[str, str]] = {
        # Composer's CheckpointSaver arguments, and the Trainer's save_* spellings.
        "save_interval": "use interval=... (e.g. '500ba', '1ep')",
        "num_checkpoints_to_keep": "use keep=... (-1: all)",
        "save_num_checkpoints_to_keep": "use keep=... (-1: all)",
        "filename": "use name_format=... (each checkpoint is a folder, e.g. 'ep{epoch}-ba{batch}')",
        "save_filename": "use name_format=... (e.g. 'ep{epoch}-ba{batch}')",
        "save_folder": "use folder=...",
        "remote_file_name": "give a URL as folder (e.g. 's3://bucket/runs/x')",
        "latest_filename": "not needed: 'latest' is written beside the checkpoints; remove it",
        "latest_remote_file_name": "not needed: 'latest' is written beside the checkpoints; "
        "remove it",
        "weights_only": "use save_weights_only=True",
        "save_overwrite": "use overwrite=True",
    }

    folder: str | None = primary()
    """Where checkpoints go, one sub-folder each (``name_format``): a local folder or a URL
    (``"s3://bucket/prefix"``). ``{run_name}`` (and ``{rank}``, ``{world_size}``, as in
    ``name_format``) are filled in when the run starts, e.g. ``"runs/{run_name}/checkpoints"``.
    A `pathlib.Path` is accepted and stored as a string. None: only load (from ``load_path``,
    which may then not be ``"latest"``), never save; ``autoresume`` needs a folder."""
    interval: str | int | Time | IntervalTrigger = "1ep"
    """How often to save: a duration (``"1ep"``, ``"500ba"``, ``"0.1dur"``; an int counts
    epochs) or, from Python, a callable ``(state, event) -> bool``. The end of every
    ``fit`` is always saved, after its epoch's end and ``FIT_END``'s algorithms (SWA's
    average): a batch that is due and ends the run is saved there, once."""
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
    crash before ``latest`` was updated) are replaced without it. Without it, too, a run
    refuses a folder whose newest checkpoint is another model's, or none of whose
    checkpoints it can load; with it, the run trains there anyway."""
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
    """Check every file's checksum before loading (sizes are always checked)."""
    checksum: str = "xxh3_128"
    """How each file's checksum in the manifest is computed (while it is written):
    ``"xxh3_128"`` (128-bit xxHash: detects corruption at memory speed, not tampering) or
    ``"sha256"`` (cryptographic, about ten times slower: 1 s of CPU per GB here, which a
    save and a load then spend). Loading checks whichever a checkpoint has."""
    lock: bool = True
    """Hold ``folder`` while saving, with a lock file naming the run, host and pid: another
    run saving there refuses to start, naming this one. A lock whose holder died (its
    process is gone from this machine, or its ``lease`` expired) is taken over with a
    warning. False: no lock (two runs on one folder then overwrite each other's work)."""
    lock_wait: float = 0.0
    """Seconds to wait for another run holding ``folder`` to let it go before refusing."""
    lease: float = 60.0
    """Seconds the hold on ``folder`` lasts unless renewed (a background thread renews it
    every third of that): how long a run on another machine waits to take over the folder
    of one that died there without letting it go."""
    storage_options: dict[str, Any] | None = None
    """For a URL, options of its storage back end (for S3: ``endpoint_url``,
    ``region_name``, ...; see `S3Storage`; for ``gs://``, ``az://`` and other fsspec URLs,
    the file system's own, e.g. ``token`` for gcsfs; see `FsspecStorage`)."""
    local_dir: str | None = None
    """For a URL, where checkpoints are staged before upload and downloaded before loading
    (default: a folder in the system's temporary directory)."""
    upload_to_loggers: bool = False
    """After each checkpoint is published, rank 0 gives its folder to every logger
    destination as the artifact ``checkpoints/<name>`` (`Logger.upload_folder`): wandb keeps
    it as one ``"model"`` artifact, MLflow under the run's artifacts at
    ``checkpoints/<name>/``, the others file by file. An asynchronous save is given once it
    is published (when the Checkpointer waits for it); a save that failed or was abandoned
    is never given. Needs a local ``folder``: checkpoints in a URL folder are already
    remote. (Composer uploads through its loggers when one has ``log_artifacts=True``;
    here the Checkpointer asks, and every destination receives them.)"""

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
        if self.upload_to_loggers:
            _check_uploadable(self.folder)
        if self.load_path is not None:
            check_folder_template(self.load_path)
        self.ignore_keys = check_ignore_keys(self.ignore_keys)
        self.exclude_algorithms = check_names(
            self.exclude_algorithms, "exclude_algorithms", "algorithm class names"
        )
        if self.storage_options is not None:
            self.storage_options = dict(self.storage_options)
        check_checksum(self.checksum)
        for name, low in (("lock_wait", 0.0), ("lease", 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= low:
                raise ValueError(
                    f"{name}={value!r} is not valid; use a number of seconds >= {low:g}"
                )
            if not math.isfinite(value):
                raise ValueError(f"{name}={value!r} is not valid; use a finite number of seconds")


def _path_text(value: Any, name: str) -> str:
    if isinstance(value, str | os.PathLike):
        return os.fspath(value)
    raise TypeError(f"{name} must be a path or a URL, got {type(value).__name__} {value!r}")


def _check_uploadable(folder: str | None) -> None:
    if folder is None:
        raise ValueError(
            "upload_to_loggers=True gives the checkpoints saved in folder to the loggers, and "
            "folder is None (load only); give a local folder, e.g. 'runs/{run_name}/checkpoints'"
        )
    if is_url(folder):
        raise ValueError(
            f"upload_to_loggers=True needs a local folder, and folder {folder!r} is a URL: its "
            "checkpoints are already remote, so there is nothing to upload. Give a local path "
            "(e.g. 'runs/{run_name}/checkpoints') to upload to the loggers, or keep the URL "
            "and set upload_to_loggers=False"
        )
