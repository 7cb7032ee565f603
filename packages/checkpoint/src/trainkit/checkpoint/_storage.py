"""Where checkpoint folders live: the `Storage` contract, the local file system, lookup by URL.

A storage holds checkpoint folders under one root (a local folder, ``s3://bucket/prefix``).
Saves always write on this machine first and then hand files to the storage; loads from a
remote storage download first. Back ends other than the built-in ones plug in through the
``trainkit.storage`` entry-point group, keyed by URL scheme::

    [project.entry-points."trainkit.storage"]
    gs = "my_package:GCSStorage"      # called as GCSStorage("gs://bucket/prefix", **options)

A storage never reaches outside its root: `LocalStorage` opens every key one name at a time
without following links and reads only regular files (`trainkit.checkpoint._confine`);
`S3Storage` and `FsspecStorage` (``gs://``, ``az://``, ``memory://``... through fsspec) refuse
keys with ``.``/``..`` parts and keys outside their prefix.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from trainkit.checkpoint._confine import atomic_write_below as atomic_write_bytes
from trainkit.checkpoint._confine import (
    lexists_below,
    open_below,
    read_below,
    remove_below,
    split_key,
)
from trainkit.checkpoint._errors import CheckpointError, UnsafePathError
from trainkit.core import plugins
from trainkit.core.messages import warn

__all__ = [
    "ConditionalStorage",
    "LocalStorage",
    "Storage",
    "default_local_dir",
    "is_url",
    "join",
    "location",
    "open_storage",
    "split_location",
]


@runtime_checkable
class Storage(Protocol):
    """A place that holds checkpoint folders.

    Keys are paths under the storage's root joined with ``/`` (``"ep1-ba8/.metadata"``).
    Writing one key is atomic: readers see the old content or the new one, never a mix.
    Methods raise `FileNotFoundError` for a missing key and `StorageError` when the storage
    cannot be reached or refuses a request (messages never hold credentials).
    """

    url: str
    """The root, for messages (``"s3://bucket/prefix"``); never holds credentials."""

    def local_path(self, key: str) -> Path | None:
        """``key`` as a path on this machine, when the storage is a file system; else None.

        Such a storage is written and read in place: saves write their shards straight
        into a hidden folder under the root and rename it into place when complete.
        """
        ...

    def upload(self, source: Path, key: str) -> None:
        """Copy the local file ``source`` to ``key``."""
        ...

    def download(self, key: str, target: Path) -> None:
        """Copy ``key`` to the local file ``target`` (its folder exists)."""
        ...

    def read_bytes(self, key: str) -> bytes: ...

    def write_bytes(self, key: str, data: bytes) -> None: ...

    def exists(self, key: str) -> bool: ...

    def list_folders(self) -> list[str]:
        """Names of the folders directly under the root (none when the root does not exist)."""
        ...

    def delete(self, key: str) -> None:
        """Remove the file or the whole folder ``key``; nothing happens when it is absent."""
        ...


@runtime_checkable
class ConditionalStorage(Storage, Protocol):
    """A storage that writes a key only if nobody changed it since it was read: what a run
    needs to hold its folder (see `trainkit.checkpoint.FolderLock`). `LocalStorage` does it
    under ``flock``, `S3Storage` with conditional requests (``If-None-Match``/``If-Match``).
    On other storages the lock is best-effort."""

    def read_versioned(self, key: str) -> tuple[bytes, str | None]:
        """The content of ``key`` and its version for `write_if`; ``(b"", None)`` when it is
        absent or empty."""
        ...

    def write_if(self, key: str, data: bytes, version: str | None) -> bool:
        """Write ``data`` to ``key`` if it is still at ``version`` (None: absent or empty);
        False, writing nothing, when it changed."""
        ...

    def delete_if(self, key: str, version: str) -> bool:
        """Delete ``key`` if it is still at ``version``; False, deleting nothing, otherwise."""
        ...


class LocalStorage:
    """Checkpoint folders in a folder of the local (or a shared network) file system.

    Keys are opened below the root one name at a time, never through a link, and only
    regular files are read (`UnsafePathError` naming the path otherwise); links in the
    root's own path are followed.
    """

    def __init__(self, root: str | os.PathLike[str]):
        if _scheme(root) == "file":
            root = urlsplit(str(root)).path
        self.root = Path(root)
        self.url = str(self.root)

    def __repr__(self) -> str:
        return f"LocalStorage({self.url!r})"

    def local_path(self, key: str) -> Path:
        return self.root / key if key else self.root

    def upload(self, source: Path, key: str) -> None:
        split_key(key, self.root)
        target = self.local_path(key)
        if target.exists() and os.path.samefile(source, target):
            return  # written in place
        atomic_write_bytes(self.root, key, source.read_bytes())

    def download(self, key: str, target: Path) -> None:
        with (
            os.fdopen(open_below(self.root, key), "rb") as source,
            open(target, "wb") as copy,
        ):
            shutil.copyfileobj(source, copy, 8 << 20)

    def read_bytes(self, key: str) -> bytes:
        try:
            return read_below(self.root, key)
        except NotADirectoryError:
            raise FileNotFoundError(f"{self.root / key} does not exist") from None

    def write_bytes(self, key: str, data: bytes) -> None:
        atomic_write_bytes(self.root, key, data)

    def exists(self, key: str) -> bool:
        return lexists_below(self.root, key)

    def list_folders(self) -> list[str]:
        # Real folders only: a link in the run folder is never taken for a checkpoint, so
        # neither loading nor rotation ever goes through one.
        try:
            entries = list(os.scandir(self.root))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))

    def delete(self, key: str) -> None:
        remove_below(self.root, key)

    # --- ConditionalStorage: the folder's lock ---------------------------------------------

    def read_versioned(self, key: str) -> tuple[bytes, str | None]:
        try:
            fd = open_below(self.root, key)
        except (FileNotFoundError, NotADirectoryError):
            return b"", None
        try:
            with _flocked(fd, _SHARED):
                data = _read_all(fd)
        finally:
            os.close(fd)
        return data, _version(data)

    def write_if(self, key: str, data: bytes, version: str | None) -> bool:
        with self._locked_file(key, create=True) as (fd, _):
            if _version(_read_all(fd)) != version:
                return False
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            os.fsync(fd)
            return True

    def delete_if(self, key: str, version: str) -> bool:
        with self._locked_file(key, create=False) as (fd, path):
            if fd < 0 or _version(_read_all(fd)) != version:
                return False
            os.unlink(path)
            return True

    @contextlib.contextmanager
    def _locked_file(self, key: str, *, create: bool) -> Iterator[tuple[int, Path]]:
        """``key`` (directly under the root) opened and ``flock``-ed; fd -1 when missing."""
        *folders, name = split_key(key, self.root)
        if folders:
            raise ValueError(f"a lock file lies directly under the root, got {key!r}")
        path = self.root / name
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
            flags |= os.O_CREAT
        while True:
            try:
                fd = os.open(path, flags, 0o644)
            except FileNotFoundError:
                yield -1, path
                return
            except OSError as err:
                if err.errno == errno.ELOOP:
                    raise UnsafePathError(f"{path} is a symbolic link; not followed") from None
                raise
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise UnsafePathError(f"{path} is not a regular file; not opened")
                with _flocked(fd, _EXCLUSIVE):
                    # Deleted (or replaced) while we waited for the lock: start again on the
                    # file that now has the name, so that every process locks the same one.
                    if _same_file(fd, path):
                        yield fd, path
                        return
            finally:
                os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_ino, named.st_dev) == (opened.st_ino, opened.st_dev)


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    return os.pread(fd, size, 0) if size else b""


def _version(data: bytes) -> str | None:
    return hashlib.sha256(data).hexdigest() if data else None


_warned_flock = False
_SHARED, _EXCLUSIVE = 1, 2  # fcntl.LOCK_SH, fcntl.LOCK_EX


@contextlib.contextmanager
def _flocked(fd: int, kind: int) -> Iterator[None]:
    """``flock`` for the moment of a read-check-write (never held longer)."""
    global _warned_flock
    try:
        import fcntl  # POSIX only

        fcntl.flock(fd, kind)
    except (OSError, ImportError) as err:
        if isinstance(err, OSError) and err.errno not in (
            errno.ENOLCK,
            errno.EOPNOTSUPP,
            errno.EINVAL,
            errno.ENOSYS,
        ):
            raise
        if not _warned_flock:  # some network file systems: the lock is then best-effort
            _warned_flock = True
            warn(
                f"this file system does not support flock ({err}): two runs starting "
                "at the same moment on one checkpoint folder may both take it",
            )
        yield
        return
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def join(*parts: str) -> str:
    """Storage keys joined with ``/``; empty parts are skipped."""
    return "/".join(part.strip("/") for part in parts if part)


def is_url(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` is a URL (``s3://...``, ``file://...``) rather than a local path."""
    return bool(_scheme(location))


def location(storage: Storage, key: str) -> Path | str:
    """Where ``key`` is, for users: a local path, or a URL such as ``s3://bucket/prefix/key``."""
    local = storage.local_path(key)
    return local if local is not None else join(storage.url, key)


def _scheme(location: str | os.PathLike[str]) -> str:
    if not isinstance(location, str):
        return ""
    scheme = urlsplit(location).scheme
    return scheme if len(scheme) > 1 else ""  # "C:\\runs" is a Windows path, not a URL


def open_storage(
    location: str | os.PathLike[str], options: Mapping[str, Any] | None = None
) -> Storage:
    """The storage whose root is ``location``: a local path, ``file://...``, ``s3://...``, ...

    ``options`` go to the back end's constructor (for S3: ``endpoint_url``, ``region_name``...).
    Other schemes are looked up in the ``trainkit.storage`` entry-point group; a scheme with
    no entry point that fsspec knows (and ``fsspec+<scheme>://``) goes to `FsspecStorage`.
    """
    scheme = _scheme(location)
    if not scheme:
        if options:
            raise ValueError(
                f"storage_options {sorted(options)} were given for the local folder {location}; "
                "they apply to remote storage only (e.g. 's3://bucket/prefix')"
            )
        return LocalStorage(location)
    try:
        factory = plugins.load("trainkit.storage", scheme)
    except LookupError as err:
        from trainkit.checkpoint import _fsspec  # any scheme fsspec knows, and fsspec+<scheme>

        if not _fsspec.supports(scheme):
            raise CheckpointError(
                f"no storage back end for {scheme}:// URLs ({location}): {err}. Install the "
                "package that provides it (fsspec's file systems: pip install "
                '"trainkit-checkpoint[fsspec]" and the file system\'s package), or register one '
                "under the 'trainkit.storage' entry-point group"
            ) from None
        factory = _fsspec.fsspec_storage
    storage = factory(location, **dict(options or {}))
    if not isinstance(storage, Storage):
        raise TypeError(f"the {scheme!r} storage back end built {storage!r}, not a Storage")
    return storage


def split_location(location: str | os.PathLike[str]) -> tuple[str | os.PathLike[str], str]:
    """``".../runs/ep1-ba8"`` -> (the folder holding it, ``"ep1-ba8"``), for URLs and paths."""
    if _scheme(location):
        text = str(location).rstrip("/")
        parent, _, name = text.rpartition("/")
        if not name or parent.endswith(":/"):
            raise ValueError(f"{location} names no folder inside a bucket or root; add a prefix")
        return parent, name
    path = Path(location)
    if path.is_symlink() and path.is_dir():
        # A folder the caller named through a link of their own: follow that one link.
        # Names read from a storage (latest, listings) are never followed.
        path = Path(os.path.realpath(path))
    return path.parent, path.name


def default_local_dir() -> Path:
    """Scratch space for remote storage: shards are staged here before upload, and
    downloaded here before loading. The same on every process of a machine."""
    return Path(tempfile.gettempdir()) / "trainkit-checkpoint"
