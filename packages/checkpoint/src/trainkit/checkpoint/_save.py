"""`save_checkpoint`: one checkpoint folder, written safely to any `Storage`.

DCP writes the shards on each rank's own machine; the steps that make them a checkpoint
(hand-over to the storage, manifest written last, ``latest``) are in `_commit`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

from trainkit.checkpoint._commit import TMP_PREFIX, Commit, begin
from trainkit.checkpoint._common import on_rank0, plain_errors, single_process_is_intended
from trainkit.checkpoint._errors import CheckpointError
from trainkit.checkpoint._manifest import FileEntry, Manifest
from trainkit.checkpoint._storage import (
    Storage,
    default_local_dir,
    location,
    open_storage,
    split_location,
)
from trainkit.core import State, dist

__all__ = ["PendingSave", "required_algorithms", "save_checkpoint", "save_to"]

T = TypeVar("T")


class PendingSave:
    """A save in progress; `wait` returns where it was published, or raises the save's error."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._path: Path | str | None = None
        self._error: BaseException | None = None

    def _finish(self, path: Path | str | None = None, error: BaseException | None = None) -> None:
        self._path, self._error = path, error
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Path | str | None:
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
    overwrite: bool = False,
    async_save: bool = False,
    layout: dict[str, Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    local_dir: str | os.PathLike[str] | None = None,
) -> PendingSave:
    """Save ``state`` as the checkpoint folder ``path``. Collective: every rank calls it.

    Args:
        path: a local folder, or a URL of a remote one (``"s3://bucket/prefix/ep1-ba8"``).
        weights_only: save only the model weights (load them with ``weights_only=True``).
        overwrite: replace what ``path`` holds (atomically on a file system). Without it a
            taken ``path`` raises `CheckpointExistsError` before anything is written.
        async_save: return once the state is staged in host memory; the write, the upload
            and the commit (manifest, ``latest``) finish in the background.
        layout: how the run was parallelised, recorded in the manifest.
        storage_options: for a URL, options of its storage back end (for S3:
            ``endpoint_url``, ``region_name``, ...; see `S3Storage`).
        local_dir: for a URL, where shards are written before they are uploaded
            (default: a folder in the system's temporary directory).

    Returns:
        A `PendingSave`; its ``wait()`` returns where the checkpoint was published.
    """
    root, name = split_location(path)
    return save_to(
        open_storage(root, storage_options),
        name,
        state,
        weights_only=weights_only,
        overwrite=overwrite,
        async_save=async_save,
        layout=layout,
        local_dir=local_dir,
    )


def save_to(
    storage: Storage,
    name: str,
    state: State,
    *,
    weights_only: bool = False,
    overwrite: bool = False,
    async_save: bool = False,
    layout: dict[str, Any] | None = None,
    local_dir: str | os.PathLike[str] | None = None,
) -> PendingSave:
    """Save ``state`` as the folder ``name`` of ``storage`` (see `save_checkpoint`)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    token = on_rank0(lambda: begin(storage, name, overwrite=overwrite))
    staging = storage.local_path(f"{TMP_PREFIX}{name}-{token}") or (
        Path(local_dir or default_local_dir()) / f"{TMP_PREFIX}{name}-{token}-rank{rank}"
    )
    staging.mkdir(parents=True, exist_ok=True)
    state_dict = {
        "state": {"model": state.state_dict()["model"]} if weights_only else state.state_dict()
    }
    manifest = Manifest(
        timestamp=state.timestamp.state_dict(),
        world_size=world,
        layout=layout or {"strategy": type(state.parallelism).__name__},
        files={},
        run_name=state.run_name,
        weights_only=weights_only,
        required_algorithms=required_algorithms(state),
    )
    published = location(storage, name)
    commit = Commit(storage, name, token, staging, manifest, overwrite=overwrite)
    pending = PendingSave()
    writer = FileSystemWriter(staging, sync_files=True)
    no_dist = not dist.is_initialized()

    if async_save:
        # The background part runs without collectives: ranks meet through side files.
        def after_write(future: Future[Any]) -> None:
            try:
                if (error := future.exception()) is not None:
                    raise error
                commit.report(rank, commit.hand_over(rank))
                if rank == 0:
                    commit.publish(commit.collect(world))
                pending._finish(published)
            except BaseException as err:
                pending._finish(error=err)
            finally:
                commit.clean_up()

        with single_process_is_intended():
            future: Future[Any] = dcp.async_save(state_dict, storage_writer=writer, no_dist=no_dist)
        future.add_done_callback(after_write)
        return pending

    try:
        with single_process_is_intended(), plain_errors(f"saving {published}"):
            dcp.save(state_dict, storage_writer=writer, no_dist=no_dist)
        listings = _on_every_rank(lambda: commit.hand_over(rank))
        on_rank0(lambda: commit.publish(_merged(listings)))
    finally:
        commit.clean_up()
    pending._finish(published)
    return pending


def required_algorithms(state: State) -> list[str]:
    """The run's algorithms a loading run must have too: those with ``required_on_load``
    (named by class ``__qualname__``, as `State` names them), sorted."""
    return sorted({type(a).__qualname__ for a in state.algorithms if a.required_on_load})


def _on_every_rank(fn: Callable[[], T]) -> list[T]:
    """Every rank's ``fn()``, in rank order; if it failed on any rank, an error on all."""
    result, error = None, None
    try:
        result = fn()
    except Exception as err:
        error = err
    gathered = dist.all_gather_object((result, None if error is None else str(error)))
    if error is not None:
        raise error
    failures = [message for _, message in gathered if message is not None]
    if failures:
        raise CheckpointError(f"another rank failed to save its shards: {failures[0]}")
    return [value for value, _ in gathered]  # type: ignore[misc]


def _merged(listings: list[dict[str, FileEntry]]) -> dict[str, FileEntry]:
    return {name: entry for listing in listings for name, entry in listing.items()}
