"""`SafeReader`: DCP's reader, confined to its folder and reading straight into the state.

- Confined: ``.metadata`` and every shard are opened as regular files inside the checkpoint
  folder, never through a link (`_confine`); ``.metadata`` must name only plain file names
  of that folder (and, given the manifest, only files it lists); ``.metadata`` itself is
  unpickled by `safe_load_metadata`.
- Fast: the shard files are read in parallel, one thread per file. Each tensor entry (a
  ``torch.save`` archive of one tensor) is located by its archive record and read with one
  ``pread`` into the tensor it loads into, without the intermediate tensor and copy of
  DCP's own reader; entries that do not fit that path (other byte order, other dtype, a
  stream transform) go through ``torch.load(weights_only=True)`` as in DCP.
"""

from __future__ import annotations

import ctypes
import io
import os
import sys
import threading
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch._weights_only_unpickler import Unpickler as WeightsOnlyUnpickler
from torch.distributed._shard._utils import narrow_tensor_by_index  # what DCP uses
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.futures import Future

from trainkit.checkpoint._confine import check_plain, open_below, read_below
from trainkit.checkpoint._errors import CheckpointError
from trainkit.checkpoint._safe import safe_load_metadata

__all__ = ["SafeReader"]

_MAX_THREADS = 8


class SafeReader(FileSystemReader):
    """Reads the checkpoint folder ``folder``; ``files`` (the manifest's names), when given,
    are the only files ``.metadata`` may point at."""

    def __init__(self, folder: str | os.PathLike[str], files: Collection[str] | None = None):
        super().__init__(folder)
        self.folder = Path(folder)
        self.files = None if files is None else frozenset(files)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        source = str(self.folder / name)
        metadata = safe_load_metadata(read_below(self.folder, name), source)
        for info in (metadata.storage_data or {}).values():
            path = check_plain(getattr(info, "relative_path", None), f"{source} (a storage path)")
            if self.files is not None and path not in self.files:
                raise CheckpointError(
                    f"{source} names the file {path!r}, which the checkpoint's manifest does not "
                    "list (so it was never checked); refusing to read it"
                )
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[Any]] = {}
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            per_file.setdefault(check_plain(info.relative_path, self.folder), []).append(item)
        lock = threading.Lock()  # the planner's state is not meant for several threads
        byte_items: list[tuple[Any, bytes]] = []

        def read_file(name: str) -> None:
            items = sorted(per_file[name], key=lambda r: self.storage_data[r.storage_index].offset)
            fd = open_below(self.folder, name)
            try:
                for item in items:
                    info = self.storage_data[item.storage_index]
                    if item.type == LoadItemType.BYTE_IO:
                        data = _pread(fd, info.offset, info.length, self.folder / name)
                        with lock:
                            byte_items.append((item, data))
                        continue
                    with lock:
                        target = planner.resolve_tensor(item).detach()
                    self._read_tensor(fd, info, item, target, self.folder / name)
                    with lock:
                        planner.commit_tensor(item, target)
            finally:
                os.close(fd)

        workers = max(1, min(_MAX_THREADS, len(per_file)))
        with ThreadPoolExecutor(workers, thread_name_prefix="trainkit-read") as pool:
            for done in [pool.submit(read_file, name) for name in sorted(per_file)]:
                done.result()
        for item, data in byte_items:  # non-tensor entries: restricted unpickling, in order
            planner.load_bytes(item, io.BytesIO(data))
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _read_tensor(self, fd: int, info: Any, item: Any, target: torch.Tensor, path: Path) -> None:
        view = _FileSlice(fd, info.offset, info.length, path)
        if not info.transform_descriptors and _read_direct(view, item, target):
            return
        tensor = torch.load(view, map_location="cpu", weights_only=True)
        tensor = narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)
        if tensor.size() != target.size():
            raise CheckpointError(
                f"{path}: entry {item.storage_index.fqn!r} has shape {tuple(tensor.size())}, "
                f"the state expects {tuple(target.size())}"
            )
        target.copy_(tensor)


def _read_direct(view: _FileSlice, item: Any, target: torch.Tensor) -> bool:
    """Read a ``torch.save`` archive of one tensor straight into ``target``; False when this
    entry needs the general path."""
    archive = torch._C.PyTorchFileReader(view)
    records = set(archive.get_all_records())
    if "data.pkl" not in records:
        return False
    if "byteorder" in records and bytes(archive.get_record("byteorder")).decode() != sys.byteorder:
        return False
    found: dict[str, tuple[torch.dtype, int]] = {}

    def persistent_load(saved_id: Any) -> Any:
        # torch.save's storage reference: ("storage", storage type, key, location, numel).
        _, storage_type, key, _location, numel = saved_id
        dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
        nbytes = numel * torch._utils._element_size(dtype)
        found[key] = (dtype, nbytes)
        # A storage without memory: unpickling gives the tensor's view (offset, sizes,
        # strides) at no cost; its bytes are read below, once.
        meta = torch.UntypedStorage(nbytes, device="meta")
        return torch.storage.TypedStorage(wrap_storage=meta, dtype=dtype, _internal=True)

    unpickler = WeightsOnlyUnpickler(io.BytesIO(bytes(archive.get_record("data.pkl"))))
    unpickler.persistent_load = persistent_load
    shell = unpickler.load()
    if not isinstance(shell, torch.Tensor) or len(found) != 1:
        return False
    ((key, (dtype, nbytes)),) = found.items()
    wanted = narrow_tensor_by_index(shell, item.storage_offsets, item.lengths)
    if wanted.dtype != target.dtype or wanted.size() != target.size():
        return False
    start = view.offset + archive.get_record_offset(f"data/{key}")
    size = wanted.element_size()
    if (wanted.storage_offset() + wanted.numel()) * size > nbytes and wanted.is_contiguous():
        raise CheckpointError(
            f"{view.path}: entry {item.storage_index.fqn!r} reaches past its data"
        )
    if wanted.is_contiguous() and target.is_contiguous() and target.device.type == "cpu":
        _pread_into(view.fd, start + wanted.storage_offset() * size, target, view.path)
        return True
    whole = torch.empty(nbytes, dtype=torch.uint8)
    _pread_into(view.fd, start, whole, view.path)
    source = whole.view(dtype).as_strided(wanted.size(), wanted.stride(), wanted.storage_offset())
    target.copy_(source)
    return True


def _pread_into(fd: int, offset: int, tensor: torch.Tensor, path: Path) -> None:
    """Fill the contiguous CPU ``tensor`` with the file's bytes from ``offset``."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return
    buffer = memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")
    done = 0
    while done < nbytes:
        count = os.preadv(fd, [buffer[done:]], offset + done)
        if count == 0:
            raise CheckpointError(f"{path} ends before the entry at byte {offset}: truncated")
        done += count


def _pread(fd: int, offset: int, length: int, path: Path) -> bytes:
    data = os.pread(fd, length, offset)
    if len(data) != length:
        raise CheckpointError(f"{path} ends before the entry at byte {offset}: truncated")
    return data


class _FileSlice(io.RawIOBase):
    """Bytes ``[offset, offset + length)`` of the open file ``fd``, as a seekable stream."""

    def __init__(self, fd: int, offset: int, length: int, path: Path):
        super().__init__()
        self.fd, self.offset, self.length, self.path = fd, offset, length, path
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        count = min(len(view), self.length - self.position)
        if count <= 0:
            return 0
        done = os.preadv(self.fd, [view[:count]], self.offset + self.position)
        self.position += done
        return done

    def seek(self, position: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.length}[whence]
        self.position = max(0, base + position)
        return self.position

    def tell(self) -> int:
        return self.position
