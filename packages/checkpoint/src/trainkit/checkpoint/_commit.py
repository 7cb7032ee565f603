"""Publishing a checkpoint, the same steps for every `Storage`.

1. Rank 0 `begin`s: a hidden ``.tmp-<name>-<token>`` folder on a file system; on an object
   store (which cannot rename) the folder ``<name>`` itself, emptied and marked
   ``.incomplete``.
2. Every rank writes its DCP shards on its own machine (in place on a file system),
   checksummed as they are written (`DigestingWriter`); `Commit.hand_over` hands them to
   the storage.
3. Rank 0 learns every rank's files, with sizes and checksums: gathered by a collective in a
   synchronous save; from side files each rank writes after its hand-over in an
   asynchronous one, whose background part runs without collectives.
4. Rank 0 `Commit.publish`es: ``.metadata``, then the manifest, last of the checkpoint's
   files; then the rename into place (file system) or removal of the marker (object
   store); then ``latest``.

A crash at any point leaves the previous checkpoint and ``latest`` intact, and a folder
without a manifest is never taken for a checkpoint.

A name that is already taken is refused in step 1, before any rank writes, unless the save
may overwrite. On a file system the new folder then replaces the old one atomically (an
exchange of the two folders, then the old one is removed), so ``<name>`` always holds one
complete checkpoint; an object store cannot rename, so there the old checkpoint is removed
in step 1 and ``<name>`` is incomplete until step 4.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import secrets
import shutil
import sys
import time
from pathlib import Path

from trainkit.checkpoint._errors import CheckpointError, CheckpointExistsError, UnsafePathError
from trainkit.checkpoint._manifest import MANIFEST, FileEntry, Manifest, fsync_dir, hasher
from trainkit.checkpoint._storage import Storage, join, location

__all__ = [
    "INCOMPLETE",
    "LATEST",
    "TMP_PREFIX",
    "Commit",
    "begin",
    "interrupted_saves",
    "occupant",
    "remove_checkpoint",
    "remove_own_checkpoint",
]

LATEST = "latest"
TMP_PREFIX = ".tmp-"
INCOMPLETE = ".incomplete"
_SIDE_FILES = ".files-{token}"
_SIDE_FILE_TIMEOUT = 600.0


def begin(storage: Storage, name: str, *, overwrite: bool) -> str:
    """Rank 0, before any rank writes: prepare the save; returns the token that names it.

    Raises `CheckpointExistsError` when ``name`` is taken and ``overwrite`` is False.
    """
    if not overwrite and (what := occupant(storage, name)) is not None:
        raise CheckpointExistsError(
            f"{location(storage, name)} already holds {what}; nothing was written. Save under "
            "another name (name_format) or folder, delete it, or allow replacing it with "
            "overwrite=True (the Trainer's save_overwrite=True)"
        )
    token = secrets.token_hex(4)
    pending = storage.local_path(f"{TMP_PREFIX}{name}-{token}")
    if pending is not None:
        pending.mkdir(parents=True)
    else:
        remove_checkpoint(storage, name)  # an object store cannot swap folders: old one first
        storage.write_bytes(join(name, INCOMPLETE), token.encode())
    return token


def occupant(storage: Storage, name: str) -> str | None:
    """What the folder ``name`` holds, in words, or None when a save may take the name
    (nothing there, or what an interrupted save on an object store left)."""
    try:
        data = storage.read_bytes(join(name, MANIFEST))
    except UnsafePathError:
        return "a symbolic link or a special file (never followed)"
    except (FileNotFoundError, IsADirectoryError):
        if not storage.exists(name) or storage.exists(join(name, INCOMPLETE)):
            return None
        return "a folder that is not a checkpoint (it has no manifest)"
    try:
        manifest = Manifest.parse(data, f"{location(storage, name)}/{MANIFEST}")
    except CheckpointError:
        return "a folder with an unreadable manifest"
    run = f" of run {manifest.run_name!r}" if manifest.run_name else ""
    return f"a checkpoint{run} (saved at batch {manifest.timestamp.get('batch', 0)})"


class Commit:
    """Steps 2-4 of one save, after DCP has written the shards into ``staging``."""

    def __init__(
        self,
        storage: Storage,
        name: str,
        token: str,
        staging: Path,
        manifest: Manifest,
        *,
        overwrite: bool,
        extra_files: dict[str, bytes] | None = None,
    ):
        self.storage, self.name, self.token = storage, name, token
        self.overwrite = overwrite
        # Small files rank 0 writes beside the shards (e.g. a HuggingFace model's config).
        self.extra_files = extra_files or {}
        self.staging, self.manifest = staging, manifest
        self.in_place = storage.local_path("") is not None
        self.pending = f"{TMP_PREFIX}{name}-{token}" if self.in_place else name
        self.side_files = join(self.pending, _SIDE_FILES.format(token=token))

    def hand_over(self, rank: int, written: dict[str, FileEntry]) -> dict[str, FileEntry]:
        """This rank's shards (DCP names them ``__<rank>_<n>.distcp``) to the storage.

        ``written``: every file this rank wrote, with the size and checksum taken while
        writing it.
        """
        entries = {name: e for name, e in written.items() if name.startswith(f"__{rank}_")}
        for file in sorted(entries):
            self.storage.upload(self.staging / file, join(self.pending, file))
        return entries

    def report(self, rank: int, files: dict[str, FileEntry]) -> None:
        """Tell rank 0, through the storage, that this rank's ``files`` are in."""
        listing = {file: entry.to_dict() for file, entry in files.items()}
        self.storage.write_bytes(
            join(self.side_files, f"rank{rank}.json"), json.dumps(listing).encode()
        )

    def collect(self, world: int) -> dict[str, FileEntry]:
        """Rank 0: every rank's `report`, once all are in."""
        files: dict[str, FileEntry] = {}
        missing, delay = list(range(world)), 0.01
        deadline = time.monotonic() + _SIDE_FILE_TIMEOUT
        while missing:
            for rank in list(missing):
                try:
                    listing = self.storage.read_bytes(join(self.side_files, f"rank{rank}.json"))
                except FileNotFoundError:
                    continue
                files.update({f: FileEntry.from_dict(e) for f, e in json.loads(listing).items()})
                missing.remove(rank)
            if missing:
                if time.monotonic() > deadline:
                    raise CheckpointError(
                        f"ranks {missing} never reported their shards for "
                        f"{location(self.storage, self.name)}; checkpoint not published"
                    )
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        self.storage.delete(self.side_files)
        return files

    def publish(self, files: dict[str, FileEntry], metadata: FileEntry) -> None:
        """Rank 0, once every rank's ``files`` are in: ``.metadata`` (``metadata``: its size
        and checksum), the manifest, then ``latest``."""
        storage = self.storage
        storage.upload(self.staging / ".metadata", join(self.pending, ".metadata"))
        extra = {}
        for file, data in sorted(self.extra_files.items()):
            storage.write_bytes(join(self.pending, file), data)
            digest = hasher(metadata.algorithm)
            digest.update(data)
            extra[file] = FileEntry(len(data), digest.hexdigest(), metadata.algorithm)
        self.manifest.files = files | extra | {".metadata": metadata}
        storage.write_bytes(join(self.pending, MANIFEST), self.manifest.to_json().encode())
        if self.in_place:
            _rename(storage, self.pending, self.name, self.overwrite)
        else:
            storage.delete(join(self.name, INCOMPLETE))
        storage.write_bytes(LATEST, f"{self.name}\n".encode())

    def clean_up(self) -> None:
        # In place, the staging folder is the checkpoint (or, after a failure, what the next
        # save clears); elsewhere it is this process's own copy.
        if not self.in_place:
            shutil.rmtree(self.staging, ignore_errors=True)


def _rename(storage: Storage, pending: str, name: str, overwrite: bool) -> None:
    source, target = storage.local_path(pending), storage.local_path(name)
    assert source is not None and target is not None, "only file systems rename"
    if not os.path.lexists(target):
        os.rename(source, target)
        fsync_dir(target.parent)
        return
    if not overwrite:  # taken while this save was written (begin found the name free)
        raise CheckpointExistsError(
            f"{target} appeared while this checkpoint was being written; it was left as it is "
            f"and the new one not published (its files are in {source})"
        )
    if _exchange(source, target):
        fsync_dir(target.parent)
    else:
        # No atomic exchange here: for a moment no folder has the name. A crash then leaves
        # both in hidden folders; `latest` names a missing folder, and resuming falls back to
        # the newest complete checkpoint.
        aside = target.with_name(f"{TMP_PREFIX}replaced-{source.name.removeprefix(TMP_PREFIX)}")
        os.rename(target, aside)
        os.rename(source, target)
        fsync_dir(target.parent)
        source = aside
    storage.delete(source.name)  # the old checkpoint (or link), now under a hidden name


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _exchange(first: Path, second: Path) -> bool:
    """Swap two folders atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    system or file system cannot (then nothing was changed)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a C library without it (glibc < 2.28, musl)
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    renameat2.argtypes += [ctypes.c_uint]
    result = renameat2(
        _AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE
    )
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # e.g. NFS, old kernels
        return False
    raise OSError(code, os.strerror(code), str(first), None, str(second))


def remove_checkpoint(storage: Storage, name: str) -> None:
    """Delete the checkpoint ``name``, its manifest first: a half-deleted folder is no checkpoint."""
    storage.delete(join(name, MANIFEST))
    storage.delete(name)


def remove_own_checkpoint(storage: Storage, name: str, run_id: str) -> list[str]:
    """Rotation: delete the checkpoint ``name`` if its manifest says run ``run_id`` wrote it.

    Only what the manifest lists (and the manifest, first) is deleted, then the folder if
    that emptied it; returns what was left in it (files the run did not write). Raises
    `CheckpointError` when the manifest is missing, unreadable or another run's.
    """
    where = location(storage, name)
    try:
        data = storage.read_bytes(join(name, MANIFEST))
    except (FileNotFoundError, IsADirectoryError):
        raise CheckpointError(f"{where} has no manifest; not deleted") from None
    manifest = Manifest.parse(data, f"{where}/{MANIFEST}")
    if not run_id or manifest.run_id != run_id:
        raise CheckpointError(
            f"{where} was written by another run (run id {manifest.run_id or 'unknown'!r}, this "
            f"run's {run_id!r}); not deleted"
        )
    storage.delete(join(name, MANIFEST))
    for file in sorted(manifest.files):
        storage.delete(join(name, file))
    local = storage.local_path(name)
    if local is None:
        return []
    try:
        local.rmdir()
    except FileNotFoundError:
        return []
    except OSError:
        return sorted(p.name for p in local.iterdir())
    fsync_dir(local.parent)
    return []


def interrupted_saves(storage: Storage) -> list[str]:
    """Folders left behind by saves that never finished."""
    return [
        folder
        for folder in storage.list_folders()
        if folder.startswith(TMP_PREFIX)
        or (not storage.exists(join(folder, MANIFEST)) and storage.exists(join(folder, INCOMPLETE)))
    ]
