"""Finding a checkpoint in a storage, and its files on this machine, verified."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from trainkit.checkpoint._commit import LATEST
from trainkit.checkpoint._common import is_node_leader, on_rank0, shareable
from trainkit.checkpoint._errors import CheckpointError
from trainkit.checkpoint._manifest import MANIFEST, Manifest
from trainkit.checkpoint._storage import Storage, default_local_dir, join, location
from trainkit.core import dist

__all__ = ["fetched", "read_manifest", "resolve"]


def resolve(storage: Storage, name: str) -> str:
    """A checkpoint folder, a ``latest`` file, or a folder holding ``latest`` -> the checkpoint's key."""
    if storage.exists(join(name, MANIFEST)):
        return name
    parent, _, base = name.rpartition("/")
    candidates = [(join(name, LATEST), name)]
    if base == LATEST:
        candidates.insert(0, (name, parent))
    for latest, folder in candidates:
        try:
            target = storage.read_bytes(latest).decode().strip()
        except (FileNotFoundError, IsADirectoryError, UnicodeDecodeError):
            continue
        if not target or "/" in target or "\\" in target or target in {".", ".."}:
            raise CheckpointError(
                f"{location(storage, latest)} holds {target!r}, not the name of a checkpoint folder"
            )
        return join(folder, target)
    where = location(storage, name)
    if not storage.exists(name):
        raise CheckpointError(f"checkpoint path {where} does not exist")
    raise CheckpointError(f"{where} is not a checkpoint: it has no {MANIFEST} and no {LATEST} file")


def read_manifest(storage: Storage, key: str) -> Manifest:
    """The manifest of the checkpoint ``key``; `CheckpointError` when it has none or it is invalid."""
    where = location(storage, key)
    try:
        data = storage.read_bytes(join(key, MANIFEST))
    except (FileNotFoundError, IsADirectoryError):
        raise CheckpointError(
            f"{where} is not a checkpoint: it has no {MANIFEST} (an interrupted save leaves none)"
        ) from None
    return Manifest.parse(data, f"{where}/{MANIFEST}")


@contextlib.contextmanager
def fetched(
    storage: Storage,
    key: str,
    *,
    verify: bool = True,
    local_dir: str | os.PathLike[str] | None = None,
    files: tuple[str, ...] | None = None,
) -> Iterator[Path]:
    """The checkpoint ``key`` as a folder on this machine, checked against its manifest.

    Collective. A file-system storage is read in place (rank 0 checks it). From a remote
    storage, the first rank of each machine downloads into ``local_dir`` while the others
    wait; the copy is removed afterwards. ``files`` limits the download to those names
    (and skips the check): enough to read what a checkpoint holds without its shards.
    """
    in_place = storage.local_path(key)
    if in_place is not None:
        if files is None:
            on_rank0(lambda: read_manifest(storage, key).verify(in_place, checksums=verify))
        yield in_place
        return
    token = dist.broadcast_object(secrets.token_hex(4) if dist.get_rank() == 0 else None)
    target = Path(local_dir or default_local_dir()) / f".download-{token}"
    leader = is_node_leader()
    error: Exception | None = None
    if leader:
        try:
            _download(storage, key, target, verify, files)
        except Exception as err:  # the other ranks wait for the outcome, whatever it is
            error = shareable(err)
    errors = [e for e in dist.all_gather_object(error) if e is not None]
    try:
        if errors:
            raise errors[0]
        yield target
        dist.barrier()  # every rank has read the files
    finally:
        if leader:
            shutil.rmtree(target, ignore_errors=True)


def _download(
    storage: Storage, key: str, target: Path, verify: bool, files: tuple[str, ...] | None
) -> None:
    where = str(location(storage, key))
    manifest = read_manifest(storage, key)
    target.mkdir(parents=True, exist_ok=True)
    (target / MANIFEST).write_text(manifest.to_json())
    for name in sorted(manifest.files) if files is None else files:
        try:
            storage.download(join(key, name), target / name)
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint {where} is missing {name}") from None
    if files is None:
        manifest.verify(target, checksums=verify, source=where)
