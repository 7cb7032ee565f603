"""`FsspecStorage`: checkpoint folders on any fsspec file system (``gs://``, ``az://``,
``hf://``, ``memory://``, ...).

fsspec and its back end (gcsfs, adlfs, huggingface_hub...) are imported only here, when such
a storage is created; a missing one is a `CheckpointError` that names the package to
install. `open_storage` comes here for every scheme that has no ``trainkit.storage`` entry
point of its own but that fsspec knows, and for ``fsspec+<scheme>://`` URLs, which pick
fsspec over a native back end (``fsspec+file:///runs`` for fsspec's local file system,
``fsspec+s3://bucket`` for s3fs instead of boto3).

It keeps the `Storage` contract as an object store does (its `local_path` is always None):
saves are staged on this machine, then uploaded, and a checkpoint is published by its
manifest, written last (`trainkit.checkpoint._commit`). Writing one key is atomic: on
fsspec's local file system through a temporary file and a rename; elsewhere one ``put``
of the whole object (object stores and ``memory://`` replace an object at once).

Confinement: keys with empty, ``.`` or ``..`` parts are refused (`UnsafePathError`) before
any request, listed folder names that are not plain names are skipped, and a deletion
refuses to run when the listing returns paths outside the folder. On fsspec's local file
system, a key reached through a symbolic link, or that is not a regular file, is refused
(checked before each request: `LocalStorage` opens without following links and is the
stricter choice there).

The folder lock (`FolderLock`) uses what the file system offers: ``flock`` on fsspec's local
file system (the same lock file `LocalStorage` takes, so both kinds of storage exclude each
other), a lock of this process on ``memory://`` (which lives in one process). Elsewhere
fsspec has no conditional write, and the lock is best-effort: written, then read back; two
runs starting at the same moment on one folder may both take it. Retries on transient
errors are the back end's own (gcsfs, adlfs and s3fs retry).
"""

from __future__ import annotations

import os
import re
import secrets
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from trainkit.checkpoint._confine import split_key
from trainkit.checkpoint._errors import CheckpointError, StorageError, UnsafePathError
from trainkit.checkpoint._manifest import fsync_dir
from trainkit.checkpoint._storage import LocalStorage, join

__all__ = ["ConditionalFsspecStorage", "FsspecStorage", "fsspec_storage"]

T = TypeVar("T")
PREFIX = "fsspec+"
_INSTALL_HINT = 'pip install "trainkit-checkpoint[fsspec]"'
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
_SECRET_WORDS = ("key", "secret", "token", "password", "credential", "sas")
_MEMORY_LOCK = threading.Lock()


def fsspec_storage(url: str, **options: Any) -> FsspecStorage:
    """The storage for ``url`` on its fsspec file system; ``options`` go to the file system
    (``token`` for gcsfs, ``account_name`` for adlfs...). The folder's lock is exact where the
    file system allows it (a `ConditionalFsspecStorage`), else best-effort."""
    fs, root, shown = _file_system(url, options)
    local = _is_local(fs)
    cls = ConditionalFsspecStorage if local or _is_memory(fs) else FsspecStorage
    return cls(url, _fs=(fs, root, shown), **options)


def supports(scheme: str) -> bool:
    """Whether ``scheme`` (``"gs"``, ``"fsspec+file"``) would be served by fsspec, were its
    back end installed; False without fsspec."""
    try:
        from fsspec.registry import known_implementations, registry
    except ImportError:
        return False
    protocol = scheme.removeprefix(PREFIX)
    return protocol in known_implementations or protocol in registry


class FsspecStorage:
    """Checkpoint folders under a URL of an fsspec file system (see the module's notes).

    Args:
        url: ``"gs://bucket/prefix"``, ``"memory://runs"``, ``"fsspec+file:///runs"``...
        **options: given to the fsspec file system (credentials, project, endpoint...).
    """

    def __init__(self, url: str, *, _fs: tuple[Any, str, str] | None = None, **options: Any):
        self.fs, self.root, self.url = _fs or _file_system(url, options)
        self._local = _is_local(self.fs)
        self._secrets = _secret_values(options)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, fs={type(self.fs).__name__})"

    # --- Storage ---------------------------------------------------------------------------

    def local_path(self, key: str) -> None:
        return None

    def upload(self, source: Path, key: str) -> None:
        path = self._path(key)
        self._call(
            "upload to", key, self._put, path, lambda tmp: self.fs.put_file(str(source), tmp)
        )

    def download(self, key: str, target: Path) -> None:
        path = self._path(key)
        self._call("download of", key, self._get, path, str(target))

    def read_bytes(self, key: str) -> bytes:
        path = self._path(key)
        return self._call("read of", key, self._cat, path)

    def write_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        self._call("upload to", key, self._put, path, lambda tmp: self.fs.pipe_file(tmp, data))

    def exists(self, key: str) -> bool:
        path = self._path(key)
        self.fs.invalidate_cache(path)
        return self._call("look-up of", key, self.fs.exists, path)

    def list_folders(self) -> list[str]:
        def names() -> list[str]:
            self.fs.invalidate_cache(self.root)
            try:
                entries = self.fs.ls(self.root, detail=True)
            except (FileNotFoundError, NotADirectoryError):
                return []
            found = []
            for entry in entries:
                if entry.get("type") != "directory" or entry.get("islink"):
                    continue  # a link is never taken for a checkpoint (fsspec's local fs)
                name = entry["name"].rstrip("/").rpartition("/")[2]
                if entry["name"].rstrip("/") == f"{self.root}/{name}" and _plain(name):
                    found.append(name)
            return sorted(found)

        return self._call("listing of", "", names)

    def delete(self, key: str) -> None:
        if not key:
            raise ValueError(f"refusing to delete everything under {self.url}")
        path = self._path(key)

        def remove() -> None:
            self._no_link_on_the_way(path.rpartition("/")[0])  # the key itself may be one
            self.fs.invalidate_cache(path)
            try:
                info = self.fs.info(path)
            except FileNotFoundError:
                return
            if info.get("type") != "directory" or info.get("islink"):
                self.fs.rm_file(path)  # a link itself, never what it points at
                self._prune(path.rpartition("/")[0])
                return
            found = self.fs.find(path, withdirs=True)
            outside = [p for p in found if p != path and not _below(p, path)]
            if outside:
                raise UnsafePathError(
                    f"the listing of {join(self.url, key)} returned paths outside it "
                    f"({outside[:3]}); nothing was deleted"
                )
            self.fs.rm(path, recursive=True)

        self._call("delete of", key, remove)

    def _prune(self, folder: str) -> None:
        """Remove ``folder`` and its parents below the root while they are empty: as on an
        object store, a folder lasts while it holds files (rotation deletes a checkpoint file
        by file)."""
        while folder != self.root and _below(folder, self.root):
            try:
                self.fs.invalidate_cache(folder)
                if self.fs.ls(folder, detail=False):
                    return
                self.fs.rmdir(folder)
            except (OSError, ValueError):  # gone already, or the back end has no folders
                return
            folder = folder.rpartition("/")[0]

    # --- the steps ---------------------------------------------------------------------------

    def _path(self, key: str) -> str:
        split_key(key, self.url)  # refuses '', '.', '..' parts before any request
        return f"{self.root}/{key}"

    def _checked(self, path: str) -> None:
        """On the local file system: refuse links on the way and files that are not regular
        (a FIFO would block a read); `FileNotFoundError` when missing."""
        if not self._local:
            return
        self._no_link_on_the_way(path)
        info = self.fs.info(path)  # FileNotFoundError when missing
        if info.get("type") == "directory":
            raise IsADirectoryError(f"{path} is a folder")
        if info.get("type") != "file":
            raise UnsafePathError(f"{path} is not a regular file; not opened")

    def _no_link_on_the_way(self, path: str) -> None:
        """On the local file system: `UnsafePathError` when ``path`` (below the root) is, or
        goes through, a symbolic link."""
        if not self._local:
            return
        inside = os.path.join(os.path.realpath(self.root), os.path.relpath(path, self.root))
        if os.path.realpath(path) != os.path.normpath(inside):
            raise UnsafePathError(
                f"{path} is or goes through a symbolic link; not followed (a checkpoint is "
                "read only from regular files inside its folder)"
            )

    def _cat(self, path: str) -> bytes:
        self._checked(path)
        return self.fs.cat_file(path)

    def _get(self, path: str, target: str) -> None:
        self._checked(path)
        self.fs.get_file(path, target)

    def _put(self, path: str, write: Callable[[str], None]) -> None:
        parent = path.rpartition("/")[0]
        if not self._local:
            try:
                write(path)  # object stores have no folders to make: no request for them
            except FileNotFoundError:  # a file system with folders (sftp, smb...)
                self.fs.makedirs(parent, exist_ok=True)
                write(path)
            return
        self._no_link_on_the_way(parent)
        self.fs.makedirs(parent, exist_ok=True)
        name = path.rpartition("/")[2]
        tmp = f"{parent}/.{name}.{secrets.token_hex(4)}.tmp"
        try:
            write(tmp)
            with open(tmp, "rb+") as written:  # durable before it gets its name
                os.fsync(written.fileno())
            self.fs.mv(tmp, path)
            fsync_dir(Path(parent))
        except BaseException:
            if self.fs.exists(tmp):
                self.fs.rm_file(tmp)
            raise

    def _call(self, what: str, key: str, request: Callable[..., T], /, *args: Any) -> T:
        where = join(self.url, key)
        try:
            return request(*args)
        except (UnsafePathError, IsADirectoryError, NotADirectoryError):
            raise
        except FileNotFoundError:
            raise FileNotFoundError(f"{where} does not exist") from None
        except Exception as err:
            detail = self._clean(f"{type(err).__name__}: {err}")
            raise StorageError(f"{what} {where} failed: {detail}") from None

    def _clean(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return _USERINFO.sub("***@", text)


class ConditionalFsspecStorage(FsspecStorage):
    """An `FsspecStorage` whose file system lets a write depend on what was read: fsspec's
    local file system (under ``flock``, as `LocalStorage`) and ``memory://`` (under a lock of
    this process, the only one that sees it). The folder's lock is then exact."""

    def __init__(self, url: str, *, _fs: tuple[Any, str, str] | None = None, **options: Any):
        super().__init__(url, _fs=_fs, **options)
        if not (self._local or _is_memory(self.fs)):
            raise ValueError(
                f"{self.url}: {type(self.fs).__name__} has no conditional writes; use "
                "FsspecStorage (fsspec_storage picks the right one)"
            )
        self._flocked = LocalStorage(self.root) if self._local else None

    def read_versioned(self, key: str) -> tuple[bytes, str | None]:
        if self._flocked is not None:
            return self._flocked.read_versioned(key)
        with _MEMORY_LOCK:
            try:
                data = self.read_bytes(key)
            except FileNotFoundError:
                return b"", None
        return data, _version(data)

    def write_if(self, key: str, data: bytes, version: str | None) -> bool:
        if self._flocked is not None:
            return self._flocked.write_if(key, data, version)
        with _MEMORY_LOCK:
            if self._current(key) != version:
                return False
            self.write_bytes(key, data)
            return True

    def delete_if(self, key: str, version: str) -> bool:
        if self._flocked is not None:
            return self._flocked.delete_if(key, version)
        with _MEMORY_LOCK:
            if self._current(key) != version:
                return False
            self.delete(key)
            return True

    def _current(self, key: str) -> str | None:
        try:
            return _version(self.read_bytes(key))
        except FileNotFoundError:
            return None


def _version(data: bytes) -> str | None:
    import hashlib

    return hashlib.sha256(data).hexdigest() if data else None


def _file_system(url: str, options: dict[str, Any]) -> tuple[Any, str, str]:
    """(the fsspec file system, the root path on it, the URL shown in messages)."""
    text = str(url).removeprefix(PREFIX)
    shown = _USERINFO.sub("***@", str(url)).rstrip("/")
    protocol = urlsplit(text).scheme
    if len(protocol) < 2:
        raise ValueError(f"{url!r} is not a URL; use e.g. 'gs://bucket/prefix' or 'memory://runs'")
    try:
        import fsspec
        from fsspec.registry import known_implementations
    except ImportError as err:
        raise CheckpointError(
            f"{protocol}:// checkpoint storage ({shown}) goes through fsspec, which is not "
            f"installed: {_INSTALL_HINT}"
        ) from err
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise CheckpointError(
            f"fsspec knows no file system for {protocol}:// URLs ({shown}); known: "
            f"{', '.join(sorted(known_implementations))}"
        ) from None
    except ImportError:
        package = known_implementations.get(protocol, {}).get("class", protocol).split(".")[0]
        raise CheckpointError(
            f"{protocol}:// checkpoint storage ({shown}) needs fsspec's back end for it, "
            f"{package}, which is not installed: pip install {package.replace('_', '-')}"
        ) from None
    root = cls._strip_protocol(text).rstrip("/")
    for part in root.split("/")[1:] if root.startswith("/") else root.split("/"):
        if part in {".", ".."}:
            raise UnsafePathError(f"{shown} has a '{part}' part; use a plain path")
    try:
        fs = cls(**options)
    except TypeError as err:
        raise ValueError(f"storage_options for {protocol}:// are not valid: {err}") from None
    return fs, root, shown


def _is_local(fs: Any) -> bool:
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def _is_memory(fs: Any) -> bool:
    from fsspec.implementations.memory import MemoryFileSystem

    return isinstance(fs, MemoryFileSystem)


def _plain(name: str) -> bool:
    return name not in {"", ".", ".."} and not any(c in name for c in "/\\\0")


def _below(path: str, folder: str) -> bool:
    inside = path.rstrip("/")
    return inside.startswith(folder.rstrip("/") + "/") and ".." not in inside.split("/")


def _secret_values(options: dict[str, Any]) -> set[str]:
    return {
        value
        for name, value in options.items()
        if isinstance(value, str) and value and any(w in name.lower() for w in _SECRET_WORDS)
    }
