"""`save_checkpoint`: one checkpoint folder, written safely to any `Storage`.

DCP writes the shards on each rank's own machine, checksummed as they are written
(`_write`); the steps that make them a checkpoint (hand-over to the storage, manifest
written last, ``latest``) are in `_commit`.

An asynchronous save copies the state into host memory (pinned when CUDA is available) and
returns; the copy's buffers are kept for the next save of the same `State` (so only the
first save allocates them), and the write, the upload and the commit run in a background
thread. (On a torch whose stager cannot stage twice, torch 2.11's, each save gets a fresh
stager and buffers: see `stager_is_reusable`.)
"""

from __future__ import annotations

import functools
import os
import socket
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.utils.weak import WeakIdKeyDictionary

from trainkit.checkpoint._blocks import BlockSavePlanner, split_blocks
from trainkit.checkpoint._commit import TMP_PREFIX, Commit, begin
from trainkit.checkpoint._common import (
    on_rank0,
    plain_error,
    plain_errors,
    single_process_is_intended,
)
from trainkit.checkpoint._errors import CheckpointError
from trainkit.checkpoint._hf_files import hf_files
from trainkit.checkpoint._manifest import FileEntry, Manifest, check_checksum
from trainkit.checkpoint._owner import model_summary
from trainkit.checkpoint._storage import (
    Storage,
    default_local_dir,
    location,
    open_storage,
    split_location,
)
from trainkit.checkpoint._write import Cancel, DigestingWriter, save_threads
from trainkit.core import State, dist

__all__ = ["PendingSave", "release_staging", "required_algorithms", "save_checkpoint", "save_to"]

T = TypeVar("T")


class _Staging:
    """Host buffers an asynchronous save copies a `State` into, reused by its next save."""

    def __init__(self) -> None:
        self.stager = DefaultStager(_host_options(cuda=torch.cuda.is_available()))
        self.in_flight: PendingSave | None = None


def _host_options(cuda: bool) -> StagingOptions:
    """Staging into this process's memory, pinned (and copied without blocking) on CUDA."""
    return StagingOptions(
        use_pinned_memory=cuda,
        use_shared_memory=False,
        use_async_staging=False,
        use_non_blocking_copy=cuda,
    )


_staging: WeakIdKeyDictionary = WeakIdKeyDictionary()  # State -> _Staging


@functools.cache
def stager_is_reusable() -> bool:
    """Whether one `DefaultStager` stages more than once on this torch.

    torch 2.11's closes its deep-copier at the end of every stage (emptying its dispatch
    table), so the next stage fails with ``KeyError: <class 'type'>``; later releases keep
    it for the stager's life. Found by staging a small dict twice (once per process).
    """
    stager = DefaultStager(_host_options(cuda=False))
    try:
        for _ in range(2):
            stager.stage({"probe": torch.zeros(1)})
    except KeyError:
        return False
    finally:
        stager.close()
    return True


def _staging_for(state: State) -> _Staging:
    staging = _staging.get(state)
    if staging is not None and staging.in_flight is not None:
        # Its buffers are still being written: copying the state into them now would tear
        # the checkpoint in flight. (The Checkpointer waits before saving anyway.)
        staging.in_flight._done.wait()
    if staging is None or not stager_is_reusable():
        if staging is not None:
            staging.stager.close()
        staging = _staging[state] = _Staging()
    return staging


def release_staging(state: State) -> None:
    """Free the host buffers asynchronous saves of ``state`` kept (after the last save)."""
    staging = _staging.pop(state, None)
    if staging is not None:
        if staging.in_flight is not None:
            staging.in_flight._done.wait()
        staging.stager.close()


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
    checksum: str = "xxh3_128",
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
        checksum: how each file's checksum in the manifest is computed, while it is
            written: ``"xxh3_128"`` (fast; corruption, not tampering) or ``"sha256"``.

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
        checksum=checksum,
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
    checksum: str = "xxh3_128",
    run_id: str = "",
    cancel: Cancel | None = None,
) -> PendingSave:
    """Save ``state`` as the folder ``name`` of ``storage`` (see `save_checkpoint`).

    ``run_id`` is recorded in the manifest (rotation deletes only its own run's
    checkpoints); setting ``cancel`` abandons the save before it is published.
    """
    check_checksum(checksum)
    rank, world = dist.get_rank(), dist.get_world_size()
    hosts = dist.all_gather_object(socket.gethostname()) if world > 1 else [""]
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
        run_id=run_id,
        model=model_summary(state_dict["state"]["model"]),
    )
    threads = save_threads(state_dict, hosts.count(hosts[rank]))
    # The model's HuggingFace config and tokenizer travel with it (rank 0 writes them).
    extra = hf_files(state.parallelism.unwrap(state.model)) if rank == 0 else {}
    job = _Job(
        published=location(storage, name),
        commit=Commit(
            storage, name, token, staging, manifest, overwrite=overwrite, extra_files=extra
        ),
        writer=DigestingWriter(staging, checksum=checksum, threads=threads, cancel=cancel),
        cancel=cancel,
    )
    if async_save:
        return job.run_async(state, state_dict)
    return job.run(state_dict)


@dataclass
class _Job:
    """The write and the commit of one save, once its folder and manifest are ready."""

    published: Path | str
    commit: Commit
    writer: DigestingWriter
    cancel: Cancel | None

    def _publish(self, listings: list[dict[str, FileEntry]]) -> None:
        if self.cancel is not None:
            self.cancel.check(f"the save of {self.published}")
        metadata = self.writer.entries([".metadata"])[".metadata"]
        self.commit.publish(_merged(listings), metadata)

    def run(self, state_dict: dict[str, Any]) -> PendingSave:
        rank, commit = dist.get_rank(), self.commit
        try:
            with single_process_is_intended(), plain_errors(f"saving {self.published}"):
                split_blocks(state_dict)  # the dict is this save's own: nothing to put back
                dcp.save(
                    state_dict,
                    storage_writer=self.writer,
                    planner=BlockSavePlanner(),
                    no_dist=not dist.is_initialized(),
                )
            listings = _on_every_rank(lambda: commit.hand_over(rank, self.writer.fs.entries))
            on_rank0(lambda: self._publish(listings))
        finally:
            commit.clean_up()
        pending = PendingSave()
        pending._finish(self.published)
        return pending

    def run_async(self, state: State, state_dict: dict[str, Any]) -> PendingSave:
        rank, world, commit, pending = (
            dist.get_rank(),
            dist.get_world_size(),
            self.commit,
            PendingSave(),
        )

        # The background part runs without collectives: ranks meet through side files.
        def after_write(future: Future[Any]) -> None:
            try:
                if (error := future.exception()) is not None:
                    raise plain_error(error, f"saving {self.published}")
                commit.report(rank, commit.hand_over(rank, self.writer.fs.entries))
                if rank == 0:
                    self._publish([commit.collect(world)])
                pending._finish(self.published)
            except BaseException as err:
                pending._finish(error=err)
            finally:
                commit.clean_up()

        host = _staging_for(state)
        with single_process_is_intended(background=True), plain_errors(f"saving {self.published}"):
            split_blocks(state_dict)  # staged as they are: views of one local tensor each
            future: Future[Any] = dcp.async_save(
                state_dict,
                storage_writer=self.writer,
                planner=BlockSavePlanner(),
                async_stager=host.stager,
                no_dist=not dist.is_initialized(),
                process_group=_background_group(),
            )
        host.in_flight = pending
        future.add_done_callback(after_write)
        return pending


_background: list[Any] = []  # [(the run's group, its background group)]


def _background_group() -> Any:
    """A gloo group for the collectives DCP runs in its background thread (None on one
    process). On the run's own group they would race the training thread's collectives
    (DDP's all-reduces), and ranks could pair different operations: gloo aborts."""
    if dist.get_world_size() == 1 or not torch.distributed.is_initialized():
        return None
    default = torch.distributed.group.WORLD
    if not _background or _background[0][0] is not default:  # a new process group
        # Collective: every rank saves at this point.
        _background[:] = [(default, torch.distributed.new_group(backend="gloo"))]
    return _background[0][1]


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
