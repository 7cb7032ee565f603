"""A checkpoint on its own: what it holds, whether it is intact (exports: `_export`).

Everything here reads only the manifest (JSON), ``.metadata`` (through the restricted
unpickler) and tensor data: no checkpoint file can run code.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from trainkit.checkpoint._errors import CheckpointError
from trainkit.checkpoint._fetch import fetched, read_manifest, resolve
from trainkit.checkpoint._manifest import Manifest
from trainkit.checkpoint._read import SafeReader
from trainkit.checkpoint._storage import Storage, location, open_storage, split_location

__all__ = [
    "MODEL_PREFIX",
    "empty_model_tensors",
    "inspect_checkpoint",
    "open_checkpoint",
    "verify_checkpoint",
]

_STATE, _MODEL = "state.", "state.model."
MODEL_PREFIX = _MODEL


def inspect_checkpoint(
    path: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """What a checkpoint holds, as plain data (JSON-ready).

    Keys: ``path``, ``timestamp``, ``world_size``, ``layout``, ``run_name``,
    ``weights_only``, ``required_algorithms`` (algorithms a run needs to load it),
    ``created`` (Unix time), ``trainkit_version``, ``torch_version``,
    ``files`` (name -> size in bytes), ``total_size``, ``keys`` (the top-level entries of
    the saved state), ``model`` (parameter name -> ``{"shape", "dtype"}``), ``model_numel``.
    Reads the manifest and ``.metadata`` only (from a remote storage, only those two are
    downloaded); does not check the shards (`verify_checkpoint` does).
    """
    storage, key = open_checkpoint(path, storage_options)
    manifest = read_manifest(storage, key)
    with fetched(storage, key, files=(".metadata",)) as folder:
        metadata = SafeReader(folder, manifest.files).read_metadata()
    model = {
        fqn.removeprefix(_MODEL): {"shape": list(meta.size), "dtype": _dtype(meta.properties.dtype)}
        for fqn, meta in sorted(metadata.state_dict_metadata.items())
        if fqn.startswith(_MODEL) and isinstance(meta, TensorStorageMetadata)
    }
    top = {fqn.removeprefix(_STATE).split(".")[0] for fqn in metadata.state_dict_metadata}
    return {
        "path": str(location(storage, key)),
        "timestamp": manifest.timestamp,
        "world_size": manifest.world_size,
        "layout": manifest.layout,
        "run_name": manifest.run_name,
        "weights_only": manifest.weights_only,
        "required_algorithms": manifest.required_algorithms,
        "created": manifest.created,
        "trainkit_version": manifest.trainkit_version,
        "torch_version": manifest.torch_version,
        "files": {name: entry.size for name, entry in sorted(manifest.files.items())},
        "total_size": sum(entry.size for entry in manifest.files.values()),
        "keys": sorted(top),
        "model": model,
        "model_numel": sum(math.prod(entry["shape"]) for entry in model.values()),
    }


def verify_checkpoint(
    path: str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    local_dir: str | os.PathLike[str] | None = None,
) -> Manifest:
    """Check a checkpoint: its manifest, every file's size and checksum, and its ``.metadata``.

    Returns the manifest; raises `CheckpointError` naming the first bad file. A remote
    checkpoint is downloaded into ``local_dir`` (a temporary folder by default) to be checked.
    """
    storage, key = open_checkpoint(path, storage_options)
    with fetched(storage, key, verify=True, local_dir=local_dir) as folder:
        manifest = Manifest.read(folder)
        SafeReader(folder, manifest.files).read_metadata()  # DCP metadata naming its files only
        return manifest


def open_checkpoint(
    path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None
) -> tuple[Storage, str]:
    root, name = split_location(path)
    storage = open_storage(root, storage_options)
    return storage, resolve(storage, name)


def empty_model_tensors(metadata: Metadata, where: Path | str) -> dict[str, torch.Tensor]:
    # Full-size tensors to load into: DCP assembles them from however the shards were cut.
    tensors = {
        fqn: torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        for fqn, meta in sorted(metadata.state_dict_metadata.items())
        if fqn.startswith(_MODEL) and isinstance(meta, TensorStorageMetadata)
    }
    if not tensors:
        raise CheckpointError(f"{where} holds no model weights to export")
    return tensors


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
