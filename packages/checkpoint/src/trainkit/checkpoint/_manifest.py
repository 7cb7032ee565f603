"""The manifest: written last, it is what makes a folder a checkpoint.

It records who wrote the checkpoint and every file in it with its size and sha256, so a
truncated or corrupted shard is found before anything is loaded from it, and the
algorithms a run needs to load it (those with ``required_on_load``, which change the
model's structure).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from trainkit.checkpoint._errors import CheckpointError

__all__ = [
    "MANIFEST",
    "FileEntry",
    "Manifest",
    "atomic_write_bytes",
    "atomic_write_text",
    "describe_files",
    "hash_file",
]

MANIFEST = "trainkit-manifest.json"
FORMAT = "trainkit-checkpoint"
VERSION = 2  # 2: required_algorithms


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str


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
    created: float = field(default_factory=time.time)
    format: str = FORMAT
    version: int = VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        path = folder / MANIFEST
        if not path.is_file():
            raise CheckpointError(
                f"{folder} is not a checkpoint: it has no {MANIFEST} (an interrupted save leaves none)"
            )
        return cls.parse(path.read_bytes(), str(path))

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
                _plain(name): FileEntry(**entry) for name, entry in raw["files"].items()
            }
            raw.setdefault("created", 0.0)  # written before trainkit recorded it
            return cls(**raw)
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise CheckpointError(f"{source} is not a valid trainkit manifest: {err}") from err

    def verify(self, folder: Path, *, checksums: bool = True, source: str | None = None) -> None:
        """Raise `CheckpointError` naming the first file that is missing, truncated or altered.

        ``source`` names the folder in errors when ``folder`` is a downloaded copy of it.
        """
        for name, entry in sorted(self.files.items()):
            local = folder / name
            path = f"{source}/{name}" if source else local
            if not local.is_file():
                raise CheckpointError(f"checkpoint {source or folder} is missing {name}")
            size = local.stat().st_size
            if size != entry.size:
                raise CheckpointError(
                    f"checkpoint file {path} has {size} bytes, the manifest says {entry.size}: truncated or replaced"
                )
            if checksums and hash_file(local) != entry.sha256:
                raise CheckpointError(
                    f"checkpoint file {path} does not match its sha256 in the manifest: corrupted or altered"
                )


def _plain(name: str) -> str:
    # Files are downloaded by these names: nothing may point outside the checkpoint folder.
    if not isinstance(name, str) or name in {"", ".", ".."} or "/" in name or "\\" in name:
        raise ValueError(f"file name {name!r} is not a plain file name")
    return name


def hash_file(path: Path, chunk: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while block := stream.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def describe_files(folder: Path, names: list[str]) -> dict[str, FileEntry]:
    return {
        name: FileEntry((folder / name).stat().st_size, hash_file(folder / name)) for name in names
    }


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
