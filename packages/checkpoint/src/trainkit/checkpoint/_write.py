"""How a rank writes its shards: DCP's writer, with each file checksummed as it is written.

One pass over the data: every block DCP writes goes into the checksum and to the file at
once (no second read to hash it), and the kernel is asked to start writing it to disk
right away (``sync_file_range``), so the final ``fsync`` finds little left to do and the
disk works while later blocks are still being serialized. A rank writes ``threads`` files
in parallel (DCP's ``thread_count``, one file per thread: ``single_file_per_rank``).

A save may be abandoned (`Cancel`): the next block written raises `SaveAbandoned`, and the
save fails before anything is published.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from trainkit.checkpoint._errors import CheckpointError
from trainkit.checkpoint._manifest import FileEntry, hasher

__all__ = ["Cancel", "DigestingWriter", "SaveAbandoned", "save_threads"]

_CHUNK = 8 << 20  # bytes hashed and written at a time
_KICK = 8 << 20  # bytes written between two requests to start writing them to disk
_MAX_THREADS = 4
_BYTES_PER_THREAD = 64 << 20  # below this a file of its own gains nothing
_WRITE = 2  # SYNC_FILE_RANGE_WRITE: start writeback, do not wait for it


class SaveAbandoned(CheckpointError):
    """The save was abandoned before it was published; the previous checkpoint stays the latest."""


class Cancel:
    """Abandons a save in progress: set it, and the save fails at its next write."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def set(self, reason: str = "abandoned") -> None:
        self.reason = reason
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def check(self, what: str) -> None:
        if self._event.is_set():
            raise SaveAbandoned(f"{what} was abandoned ({self.reason}); nothing was published")


def save_threads(state_dict: Any, ranks_here: int = 1) -> int:
    """Files a rank writes in parallel: the CPUs this process may use, shared by the ranks
    on this machine, at most 4 (more rarely helps one disk), and one per 64 MiB of its state
    at least (a small state is written as one file)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    by_size = -(-_tensor_bytes(state_dict) // _BYTES_PER_THREAD)
    return max(1, min(_MAX_THREADS, cpus // max(1, ranks_here), by_size))


def _tensor_bytes(tree: Any) -> int:
    if isinstance(tree, torch.Tensor):
        local = getattr(tree, "_local_tensor", tree)  # a DTensor: this rank's shard
        return local.numel() * local.element_size()
    if isinstance(tree, dict):
        return sum(_tensor_bytes(value) for value in tree.values())
    if isinstance(tree, list | tuple):
        return sum(_tensor_bytes(value) for value in tree)
    return 0


def _load_sync_file_range() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return function


_sync_file_range = _load_sync_file_range()


class _DigestingStream(io.RawIOBase):
    """A file being written: every block goes into the checksum and to the disk."""

    def __init__(self, fd: int, algorithm: str, cancel: Cancel | None, path: Path):
        super().__init__()
        self.fd, self.digest, self.cancel, self.path = fd, hasher(algorithm), cancel, path
        self.size = self.kicked = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self.cancel is not None:
            self.cancel.check(f"writing {self.path}")
        view = memoryview(data).cast("B")
        # In blocks, each hashed, written and handed to the disk in turn: the disk starts on
        # the first while the next is hashed, instead of after a whole tensor.
        for start in range(0, len(view), _CHUNK):
            block = view[start : start + _CHUNK]
            self.digest.update(block)
            done = 0
            while done < len(block):
                done += os.write(self.fd, block[done:])
            self.size += done
            if _sync_file_range is not None and self.size - self.kicked >= _KICK:
                # Start writing back what is written so far; returns at once.
                _sync_file_range(self.fd, self.kicked, self.size - self.kicked, _WRITE)
                self.kicked = self.size
        return len(view)

    def tell(self) -> int:
        return self.size

    def fileno(self) -> int:
        return self.fd

    def flush(self) -> None:
        pass


class _DigestingFileSystem(FileSystem):
    """DCP's local file system, whose written files are checksummed on the way."""

    def __init__(self, algorithm: str, cancel: Cancel | None):
        super().__init__()
        self.algorithm, self.cancel = algorithm, cancel
        self.entries: dict[str, FileEntry] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        if mode != "wb":
            raise ValueError(
                f"the checkpoint writer only writes new files, asked for mode {mode!r}"
            )
        path = Path(path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o644)
        stream = _DigestingStream(fd, self.algorithm, self.cancel, path)
        try:
            yield stream
        finally:
            os.close(fd)
        with self._lock:
            self.entries[path.name] = FileEntry(
                stream.size, stream.digest.hexdigest(), self.algorithm
            )

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)  # .metadata.tmp -> .metadata
        with self._lock:
            if (entry := self.entries.pop(Path(path).name, None)) is not None:
                self.entries[Path(new_path).name] = entry


class DigestingWriter(FileSystemWriter):
    """DCP's `FileSystemWriter` into a fresh folder: ``threads`` files per rank written in
    parallel, each fsynced, checksummed while written (`entries`)."""

    def __init__(self, path: Path, *, checksum: str, threads: int, cancel: Cancel | None = None):
        super().__init__(path, single_file_per_rank=True, sync_files=True, thread_count=threads)
        self.fs = _DigestingFileSystem(checksum, cancel)

    def entries(self, names: list[str]) -> dict[str, FileEntry]:
        """The sizes and checksums of the files ``names`` this writer wrote."""
        missing = [name for name in names if name not in self.fs.entries]
        if missing:
            raise CheckpointError(f"the writer has no record of {missing} in {self.path}")
        return {name: self.fs.entries[name] for name in names}
