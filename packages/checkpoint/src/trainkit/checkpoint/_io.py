"""`save_checkpoint` / `load_checkpoint`: one checkpoint folder, written safely, read safely.

Saving writes the DCP shards into a hidden ``.tmp-*`` folder beside the target. Each
rank lists its own files with sizes and sha256 in a small side file; rank 0 merges them
into the manifest, writes it last, renames the folder into place, and replaces ``latest``
atomically. A crash at any point leaves the previous checkpoint and ``latest`` intact.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import json
import os
import secrets
import shutil
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint._nested_dict import flatten_state_dict  # DCP's own key naming
from torch.distributed.checkpoint.api import CheckpointException

from trainkit.checkpoint._errors import CheckpointError
from trainkit.checkpoint._manifest import (
    MANIFEST,
    FileEntry,
    Manifest,
    atomic_write_text,
    describe_files,
    fsync_dir,
)
from trainkit.checkpoint._safe import SafeLoadPlanner, SafeReader
from trainkit.core import State, dist

__all__ = ["LATEST", "PendingSave", "load_checkpoint", "resolve_checkpoint", "save_checkpoint"]

LATEST = "latest"
TMP_PREFIX = ".tmp-"
_SIDE_FILE = ".files-rank{rank}.json"
_SIDE_FILE_TIMEOUT = 600.0


class PendingSave:
    """A save in progress; `wait` returns the published folder or raises the save's error."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._path: Path | None = None
        self._error: BaseException | None = None

    def _finish(self, path: Path | None = None, error: BaseException | None = None) -> None:
        self._path, self._error = path, error
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Path | None:
        if not self._done.wait(timeout):
            raise TimeoutError(f"checkpoint save still running after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._path


def save_checkpoint(
    state: State,
    path: str | os.PathLike[str],
    *,
    weights_only: bool = False,
    async_save: bool = False,
    layout: dict[str, Any] | None = None,
) -> PendingSave:
    """Save ``state`` as the checkpoint folder ``path``. Collective: every rank calls it.

    With ``async_save``, returns once the state is staged in host memory; the write and
    the commit (manifest, rename, ``latest``) finish in the background. Otherwise returns
    after the commit. Either way, the returned `PendingSave` tells the outcome.
    """
    final = Path(path)
    token = dist.broadcast_object(secrets.token_hex(4) if dist.get_rank() == 0 else None)
    staging = final.parent / f"{TMP_PREFIX}{final.name}-{token}"
    if dist.get_rank() == 0:
        staging.mkdir(parents=True, exist_ok=False)
    dist.barrier()
    state_dict = {
        "state": {"model": state.state_dict()["model"]} if weights_only else state.state_dict()
    }
    manifest = Manifest(
        timestamp=state.timestamp.state_dict(),
        world_size=state.world_size,
        layout=layout or {"strategy": type(state.parallelism).__name__},
        files={},
        run_name=state.run_name,
        weights_only=weights_only,
    )
    pending = PendingSave()
    writer = FileSystemWriter(staging, sync_files=True)
    rank, world = dist.get_rank(), dist.get_world_size()
    no_dist = not dist.is_initialized()

    def after_write(error: BaseException | None) -> None:
        try:
            if error is not None:
                raise error
            _write_side_file(staging, rank)
            published = _commit(staging, final, manifest, world) if rank == 0 else final
            pending._finish(published)
        except BaseException as err:
            pending._finish(error=err)

    if async_save:
        with _single_process_is_intended():
            future: Future[Any] = dcp.async_save(state_dict, storage_writer=writer, no_dist=no_dist)
        future.add_done_callback(lambda f: after_write(f.exception()))
    else:
        with _single_process_is_intended(), _plain_errors(f"saving {final}"):
            dcp.save(state_dict, storage_writer=writer, no_dist=no_dist)
        after_write(None)
        dist.barrier()
        pending.wait()
    return pending


@contextlib.contextmanager
def _single_process_is_intended() -> Iterator[None]:
    # DCP warns on every call without a process group; one process is a supported layout.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


@contextlib.contextmanager
def _plain_errors(what: str) -> Iterator[None]:
    # DCP reports failures as CheckpointException, a BaseException that ordinary handlers
    # miss: surface our own errors as they are, and anything else as a CheckpointError.
    try:
        yield
    except CheckpointException as err:
        causes = [exc for exc, _ in err.failures.values()]
        for cause in causes:
            if isinstance(cause, CheckpointError):
                raise cause from err
        summary = "; ".join(f"{type(c).__name__}: {c}" for c in causes)
        raise CheckpointError(f"{what} failed: {summary}") from err


def _write_side_file(staging: Path, rank: int) -> None:
    # Each rank hashes the shards it wrote (DCP names them __<rank>_<n>.distcp).
    names = sorted(p.name for p in staging.iterdir() if p.name.startswith(f"__{rank}_"))
    entries = {n: vars(e) for n, e in describe_files(staging, names).items()}
    atomic_write_text(staging / _SIDE_FILE.format(rank=rank), json.dumps(entries))


def _commit(staging: Path, final: Path, manifest: Manifest, world: int) -> Path:
    side_files = [staging / _SIDE_FILE.format(rank=r) for r in range(world)]
    deadline = time.monotonic() + _SIDE_FILE_TIMEOUT
    while not all(p.exists() for p in side_files):
        if time.monotonic() > deadline:
            missing = [p.name for p in side_files if not p.exists()]
            raise CheckpointError(
                f"ranks never reported their shards for {final} ({missing}); checkpoint not published"
            )
        time.sleep(0.01)
    files: dict[str, Any] = {}
    for side_file in side_files:
        files.update(json.loads(side_file.read_text()))
    manifest.files = {name: FileEntry(**entry) for name, entry in files.items()}
    manifest.files.update(describe_files(staging, [".metadata"]))
    for side_file in side_files:
        side_file.unlink()
    atomic_write_text(staging / MANIFEST, manifest.to_json())
    if final.exists():
        shutil.rmtree(final)  # a re-save at the same point replaces the old folder
    os.rename(staging, final)
    fsync_dir(final.parent)
    atomic_write_text(final.parent / LATEST, final.name + "\n")
    return final


def resolve_checkpoint(path: str | os.PathLike[str]) -> Path:
    """A checkpoint folder, the ``latest`` file, or a folder holding ``latest`` -> the checkpoint folder."""
    path = Path(path)
    if (path / MANIFEST).is_file():
        return path
    latest = path if path.name == LATEST and path.is_file() else path / LATEST
    if latest.is_file():
        return latest.parent / latest.read_text().strip()
    if not path.exists():
        raise CheckpointError(f"checkpoint path {path} does not exist")
    raise CheckpointError(f"{path} is not a checkpoint: it has no {MANIFEST} and no {LATEST} file")


def load_checkpoint(
    state: State,
    path: str | os.PathLike[str],
    *,
    weights_only: bool = False,
    strict: bool = True,
    ignore_keys: Sequence[str] = (),
    verify: bool = True,
) -> Manifest:
    """Load a checkpoint into ``state``. Collective: every rank calls it.

    Args:
        path: a checkpoint folder, a ``latest`` file, or a folder with a ``latest`` file.
        weights_only: load only the model weights (e.g. to fine-tune from another run).
        strict: the model's parameter names must match the checkpoint's exactly.
        ignore_keys: glob patterns of entries not to load, e.g. ``"model/head.*"``, ``"rng"``.
        verify: check every file's sha256 against the manifest first (sizes always).
    """
    folder = resolve_checkpoint(path)
    error = None
    if dist.get_rank() == 0:
        try:
            Manifest.read(folder).verify(folder, checksums=verify)
        except CheckpointError as err:
            error = str(err)
    error = dist.broadcast_object(error)
    if error is not None:
        raise CheckpointError(error)
    manifest = Manifest.read(folder)
    if manifest.weights_only and not weights_only:
        raise CheckpointError(f"{folder} holds model weights only; load it with weights_only=True")
    live = state.state_dict()
    template: dict[str, Any] = {"model": live["model"]} if weights_only else live
    if "rng" in template:
        # One entry per rank of the run that saved, whatever this run's world size.
        # DCP loads into the template's tensors in place, so each entry needs its own.
        mine = live["rng"][dist.get_rank()]
        template["rng"] = [copy.deepcopy(mine) for _ in range(manifest.world_size)]
    ignored = _drop_ignored(template, ignore_keys)
    reader = SafeReader(folder)
    _check_model_keys(
        template, reader, strict and not any(k.startswith("model/") for k in ignored), folder
    )
    full = {"state": template}
    with _single_process_is_intended(), _plain_errors(f"loading {folder}"):
        dcp.load(
            full,
            storage_reader=reader,
            planner=SafeLoadPlanner(allow_partial_load=True),
            no_dist=not dist.is_initialized(),
        )
    with warnings.catch_warnings():
        if weights_only:
            warnings.simplefilter("ignore")
        state.load_state_dict(full["state"], strict=strict and not ignored)
    return manifest


def _drop_ignored(template: dict[str, Any], patterns: Sequence[str]) -> list[str]:
    dropped: list[str] = []
    if not patterns:
        return dropped

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key in list(node):
            path = f"{prefix}{key}"
            if any(
                fnmatch.fnmatchcase(path, p) or fnmatch.fnmatchcase(f"state/{path}", p)
                for p in patterns
            ):
                del node[key]
                dropped.append(path)
            elif isinstance(node[key], dict):
                walk(node[key], f"{path}/")

    walk(template, "")
    unused = [
        p
        for p in patterns
        if not any(
            fnmatch.fnmatchcase(d, p) or fnmatch.fnmatchcase(f"state/{d}", p) for d in dropped
        )
    ]
    if unused:
        warnings.warn(
            f"ignore_keys patterns {unused} matched nothing in the run's state", stacklevel=3
        )
    return dropped


def _check_model_keys(
    template: dict[str, Any], reader: SafeReader, strict: bool, folder: Path
) -> None:
    saved = {
        k.removeprefix("state.model.")
        for k in reader.read_metadata().state_dict_metadata
        if k.startswith("state.model.")
    }
    flat, _ = flatten_state_dict({"state": {"model": template.get("model", {})}})
    wanted = {k.removeprefix("state.model.") for k in flat}
    missing, unexpected = sorted(wanted - saved), sorted(saved - wanted)
    if (missing and strict) or (unexpected and strict):
        raise CheckpointError(
            f"checkpoint {folder} does not fit this model: missing from the checkpoint {missing[:20]}"
            f"{' ...' if len(missing) > 20 else ''}; not in the model {unexpected[:20]}"
            f"{' ...' if len(unexpected) > 20 else ''}. Load with strict=False to skip them, or "
            "ignore_keys=['model/<name pattern>'] to keep the model's own values for some"
        )
    if missing:
        warnings.warn(f"not in checkpoint {folder}, left as they are: {missing[:20]}", stacklevel=3)
