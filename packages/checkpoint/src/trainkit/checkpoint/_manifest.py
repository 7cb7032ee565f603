"""The manifest: written last, it is what makes a folder a checkpoint.

It records who wrote the checkpoint and every file in it with its size and checksum, so a
truncated or corrupted shard is found before anything is loaded from it, and the
algorithms a run needs to load it (those with ``required_on_load``, which change the
model's structure).

Checksums: ``xxh3_128`` (the default: 128-bit xxHash, at memory speed, made to detect
corruption, not tampering) or ``sha256`` (cryptographic, about ten times slower; the only
one before manifest version 3). Either only protects against damage: the manifest itself
is not signed, so whoever can write it can also rewrite the checksums.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from trainkit.checkpoint._confine import check_plain, open_below, read_below
from trainkit.checkpoint._errors import CheckpointError

__all__ = [
    "CHECKSUMS",
    "MANIFEST",
    "FileEntry",
    "Manifest",
    "atomic_write_bytes",
    "atomic_write_text",
    "hash_file",
    "hasher",
]

MANIFEST = "trainkit-manifest.json"
FORMAT = "trainkit-checkpoint"
VERSION = 4  # 2: required_algorithms; 3: run_id, checksums other than sha256; 4: model
CHECKSUMS = ("sha256", "xxh3_128")
_CHUNK = 8 << 20
_VERIFY_THREADS = 8


def check_checksum(algorithm: object) -> str:
    """``algorithm`` if trainkit computes it; `ValueError` naming the accepted ones otherwise."""
    if algorithm not in CHECKSUMS:
        raise ValueError(f"checksum {algorithm!r} is not known; use one of {list(CHECKSUMS)}")
    return algorithm  # type: ignore[return-value]


def hasher(algorithm: str) -> Any:
    """A new hash object (``update``, ``hexdigest``) for ``algorithm``."""
    if algorithm == "sha256":
        return hashlib.sha256()
    check_checksum(algorithm)
    import xxhash  # a dependency of trainkit-checkpoint; imported on first use

    return xxhash.xxh3_128()


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: its size, and its checksum by ``algorithm``."""

    size: int
    checksum: str
    algorithm: str = "sha256"

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, self.algorithm: self.checksum}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> FileEntry:
        found = [name for name in CHECKSUMS if name in raw]
        if set(raw) != {"size", *found} or len(found) != 1 or not isinstance(raw["size"], int):
            raise ValueError(f"file entry {raw!r} is not {{'size': n, '<checksum>': hex}}")
        return cls(raw["size"], str(raw[found[0]]), found[0])


@dataclass
class Manifest:
    """What a checkpoint holds. `read` checks it; `verify` checks the files against it."""

    timestamp: dict[str, Any]
    world_size: int
    layout: dict[str, Any]
    files: dict[str, FileEntry]
    trainkit_version: str = field(default_factory=lambda: _version("trainkit-checkpoint"))
    torch_version: str = field(default_factory=lambda: torch.__version__)
    run_name: str = ""
    weights_only: bool = False
    required_algorithms: list[str] = field(default_factory=list)
    """Algorithms (class ``__qualname__``) the saving run had whose ``required_on_load`` is
    set: a run without one of them cannot load the checkpoint."""
    run_id: str = ""
    """Random, fixed for a run and the runs that resume it: rotation deletes only
    checkpoints with its own (empty in manifests before version 3)."""
    model: dict[str, Any] = field(default_factory=dict)
    """The saving model's shape: ``{"fingerprint", "tensors", "values"}`` of its state-dict
    names and shapes (empty before version 4); a run of another model refuses the folder."""
    created: float = field(default_factory=time.time)
    format: str = FORMAT
    version: int = VERSION

    def to_json(self) -> str:
        raw = asdict(self)
        raw["files"] = {name: entry.to_dict() for name, entry in self.files.items()}
        return json.dumps(raw, indent=2, sort_keys=True)

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        """The manifest of the checkpoint folder ``folder`` (a regular file in it, no link)."""
        try:
            data = read_below(folder, MANIFEST)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise CheckpointError(
                f"{folder} is not a checkpoint: it has no {MANIFEST} (an interrupted save leaves none)"
            ) from None
        return cls.parse(data, str(folder / MANIFEST))

    @classmethod
    def parse(cls, data: bytes, source: str) -> Manifest:
        """The manifest in ``data`` (read from ``source``, named in errors)."""
        try:
            raw = json.loads(data)
            if raw.get("format") != FORMAT:
                raise ValueError(f"format {raw.get('format')!r}")
            if raw.get("version", 0) > VERSION:
                raise ValueError(
                    f"version {raw['version']} is newer than this trainkit reads ({VERSION})"
                )
            raw["files"] = {
                check_plain(name, source): FileEntry.from_dict(entry)
                for name, entry in raw["files"].items()
            }
            raw.setdefault("created", 0.0)  # written before trainkit recorded it
            return cls(**raw)
        except CheckpointError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise CheckpointError(f"{source} is not a valid trainkit manifest: {err}") from err

    def verify(self, folder: Path, *, checksums: bool = True, source: str | None = None) -> None:
        """Raise `CheckpointError` naming the first file that is missing, truncated or altered.

        Files are opened only as regular files inside ``folder`` (`UnsafePathError`
        otherwise) and checked in parallel. ``source`` names the folder in errors when
        ``folder`` is a downloaded copy of it.
        """
        names = sorted(self.files)
        workers = max(1, min(_VERIFY_THREADS, len(names)))
        with ThreadPoolExecutor(workers, thread_name_prefix="trainkit-verify") as pool:
            found = list(
                pool.map(lambda n: _check(folder, n, self.files[n], checksums, source), names)
            )
        for error in found:
            if error is not None:
                raise error


def _check(
    folder: Path, name: str, entry: FileEntry, checksums: bool, source: str | None
) -> CheckpointError | None:
    path = f"{source}/{name}" if source else folder / name
    try:
        fd = open_below(folder, name)
    except (FileNotFoundError, NotADirectoryError):
        return CheckpointError(f"checkpoint {source or folder} is missing {name}")
    except CheckpointError as err:
        return err
    with os.fdopen(fd, "rb", buffering=0) as stream:
        size = os.fstat(fd).st_size
        if size != entry.size:
            return CheckpointError(
                f"checkpoint file {path} has {size} bytes, the manifest says {entry.size}: truncated or replaced"
            )
        if checksums and _digest(stream, entry.algorithm) != entry.checksum:
            return CheckpointError(
                f"checkpoint file {path} does not match its {entry.algorithm} in the manifest: "
                "corrupted or altered"
            )
    return None


def _digest(stream: Any, algorithm: str) -> str:
    digest, buffer = hasher(algorithm), bytearray(_CHUNK)
    view = memoryview(buffer)
    while count := stream.readinto(buffer):
        digest.update(view[:count])
    return digest.hexdigest()


def hash_file(path: Path, algorithm: str = "sha256") -> str:
    """The checksum of the file ``path`` (a file the caller chose: links are followed)."""
    with open(path, "rb", buffering=0) as stream:
        return _digest(stream, algorithm)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old or the new content, never a mix."""
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old or the new content, never a mix."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"
