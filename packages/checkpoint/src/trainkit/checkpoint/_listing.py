"""The checkpoints a folder holds: complete ones (with a readable manifest), by training time."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainkit.checkpoint._commit import LATEST, TMP_PREFIX, remove_own_checkpoint
from trainkit.checkpoint._errors import CheckpointError, UnsafePathError
from trainkit.checkpoint._manifest import MANIFEST, Manifest
from trainkit.checkpoint._names import format_name
from trainkit.checkpoint._storage import Storage, join, location, open_storage
from trainkit.core import State, Timestamp, dist
from trainkit.core.messages import warn

__all__ = ["complete", "future_collisions", "list_checkpoints", "manifests", "rotate"]


def list_checkpoints(
    folder: str | os.PathLike[str],
    *,
    newest_first: bool = True,
    prefer_latest: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> list[Path] | list[str]:
    """Complete checkpoints (with a readable manifest) in ``folder``, ordered by training time.

    With ``prefer_latest``, the one named by ``latest`` comes first when it is complete.
    Local folders give paths; URLs (``"s3://bucket/prefix"``) give URLs. Links in the folder
    are never taken for checkpoints.
    """
    storage = open_storage(folder, storage_options)
    names = complete(storage, newest_first=newest_first, prefer_latest=prefer_latest)
    return [location(storage, name) for name in names]  # type: ignore[return-value]


def manifests(storage: Storage) -> list[tuple[str, Manifest]]:
    """Every complete checkpoint (with a readable manifest) in ``storage``, by name."""
    found = []
    for name in storage.list_folders():
        if name.startswith(TMP_PREFIX):
            continue
        try:
            data = storage.read_bytes(join(name, MANIFEST))
        except (FileNotFoundError, IsADirectoryError):
            continue  # not a checkpoint, or an interrupted save
        except UnsafePathError as err:
            warn(f"skipping {location(storage, name)}: {err}")
            continue
        try:
            found.append((name, Manifest.parse(data, f"{location(storage, name)}/{MANIFEST}")))
        except CheckpointError:
            continue
    return found


def complete(storage: Storage, *, newest_first: bool, prefer_latest: bool = False) -> list[str]:
    """The names of `manifests`, by training time (batch, then creation time)."""
    found = [(m.timestamp.get("batch", 0), m.created, name) for name, m in manifests(storage)]
    ordered = [name for *_, name in sorted(found, reverse=newest_first)]
    if prefer_latest:
        try:
            named = storage.read_bytes(LATEST).decode().strip()
        except (FileNotFoundError, IsADirectoryError, UnicodeDecodeError):
            named = ""
        except UnsafePathError as err:
            warn(f"ignoring {location(storage, LATEST)}: {err}")
            named = ""
        if named in ordered:
            ordered.remove(named)
            ordered.insert(0, named)
    return ordered


def rotate(storage: Storage, run_id: str, keep: int) -> None:
    """Delete the checkpoints of run ``run_id`` but its newest ``keep`` (manifest-checked:
    other runs' checkpoints, links and folders without a manifest are never touched)."""
    own = sorted(
        (m.timestamp.get("batch", 0), m.created, name)
        for name, m in manifests(storage)
        if run_id and m.run_id == run_id
    )
    for *_, old in reversed(own[: max(0, len(own) - keep)]):
        left = remove_own_checkpoint(storage, old, run_id)
        if left:
            warn(
                f"{location(storage, old)}: kept {left}, which the run did not write (only its "
                "checkpoint's files were deleted)",
            )


def future_collisions(
    storage: Storage, name_format: str, state: State, *, exempt: frozenset[str]
) -> list[str]:
    """Checkpoints in ``storage`` from later in training than ``state`` that a run with
    ``name_format`` would save over (same name at the same point), but those ``exempt``."""
    clashes = []
    for name, manifest in manifests(storage):
        if manifest.timestamp.get("batch", 0) <= state.timestamp.batch:
            continue
        try:
            then = Timestamp.from_state_dict(manifest.timestamp)
            again = format_name(
                name_format,
                timestamp=then,
                run_name=state.run_name,
                world_size=dist.get_world_size(),
            )
        except (ValueError, TypeError, KeyError):
            continue
        if again == name and name not in exempt:
            clashes.append(f"{name} (batch {then.batch})")
    return clashes
