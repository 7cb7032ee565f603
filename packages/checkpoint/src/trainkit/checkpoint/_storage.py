"""Where checkpoint folders live: the `Storage` contract, the local file system, lookup by URL.

A storage holds checkpoint folders under one root (a local folder, ``s3://bucket/prefix``).
Saves always write on this machine first and then hand files to the storage; loads from a
remote storage download first. Back ends other than the built-in ones plug in through the
``trainkit.storage`` entry-point group, keyed by URL scheme::

    [project.entry-points."trainkit.storage"]
    gs = "my_package:GCSStorage"      # called as GCSStorage("gs://bucket/prefix", **options)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from trainkit.checkpoint._errors import CheckpointError
from trainkit.checkpoint._manifest import atomic_write_bytes
from trainkit.core import plugins

__all__ = [
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


class LocalStorage:
    """Checkpoint folders in a folder of the local (or a shared network) file system."""

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
        target = self.local_path(key)
        if target.exists() and os.path.samefile(source, target):
            return  # written in place
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(target, source.read_bytes())

    def download(self, key: str, target: Path) -> None:
        shutil.copyfile(self.local_path(key), target)

    def read_bytes(self, key: str) -> bytes:
        return self.local_path(key).read_bytes()

    def write_bytes(self, key: str, data: bytes) -> None:
        path = self.local_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data)

    def exists(self, key: str) -> bool:
        return self.local_path(key).exists()

    def list_folders(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(child.name for child in self.root.iterdir() if child.is_dir())

    def delete(self, key: str) -> None:
        path = self.local_path(key)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


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
    Other schemes are looked up in the ``trainkit.storage`` entry-point group.
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
        raise CheckpointError(
            f"no storage back end for {scheme}:// URLs ({location}): {err}. Install the package "
            "that provides it, or register one under the 'trainkit.storage' entry-point group"
        ) from None
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
    return path.parent, path.name


def default_local_dir() -> Path:
    """Scratch space for remote storage: shards are staged here before upload, and
    downloaded here before loading. The same on every process of a machine."""
    return Path(tempfile.gettempdir()) / "trainkit-checkpoint"
