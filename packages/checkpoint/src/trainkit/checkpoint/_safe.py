"""Reading DCP checkpoints without ever executing code from them.

torch's `FileSystemReader` unpickles ``.metadata`` with plain `pickle.load`, and its
default load planner reads non-tensor entries with torch's full unpickler (weights_only off).
Either would run whatever a crafted file asks for. Here ``.metadata`` goes through an
unpickler that only builds DCP's own metadata classes, and non-tensor entries through
``torch.load(weights_only=True)``. (`trainkit.checkpoint._read.SafeReader` uses both, and
keeps every read inside the checkpoint folder.)
"""

from __future__ import annotations

import enum
import io
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element  # what DCP's own planner uses
from torch.distributed.checkpoint.metadata import Metadata

from trainkit.checkpoint._blocks import BlockLoadPlanner
from trainkit.checkpoint._errors import CheckpointError, UnsafeCheckpointError

__all__ = ["SafeLoadPlanner", "safe_load_metadata"]

_ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PureWindowsPath"),
        ("collections", "OrderedDict"),
    }
)


def _is_metadata_class(name: str) -> bool:
    # Plain data classes and enums defined in torch's metadata module only.
    value = getattr(dcp_metadata, name, None)
    return (
        isinstance(value, type)
        and value.__module__ == dcp_metadata.__name__
        and (hasattr(value, "__dataclass_fields__") or issubclass(value, enum.Enum))
    )


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, source: str):
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module == dcp_metadata.__name__ and _is_metadata_class(name):
            return getattr(dcp_metadata, name)
        raise UnsafeCheckpointError(
            f"{self.source} asks to load {module}.{name}, which is not checkpoint metadata; "
            "refusing to load it (nothing from it was executed). Only checkpoints from a "
            "trusted writer of the DCP format can be loaded"
        )


def safe_load_metadata(data: bytes, source: str) -> Metadata:
    """Unpickle DCP metadata, allowing only DCP's own metadata classes."""
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data), source).load()
    except UnsafeCheckpointError:
        raise
    except Exception as err:
        raise CheckpointError(
            f"{source} is not valid checkpoint metadata ({type(err).__name__}: {err})"
        ) from err
    if not isinstance(metadata, Metadata):
        raise CheckpointError(
            f"{source} holds a {type(metadata).__name__}, not checkpoint metadata"
        )
    return metadata


class SafeLoadPlanner(BlockLoadPlanner):
    """Loads non-tensor entries with ``weights_only=True``; may skip keys absent from the checkpoint."""

    def __init__(self, *, allow_partial_load: bool = False):
        super().__init__(allow_partial_load=allow_partial_load)

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            # torch's message goes on to suggest weights_only=False: not for untrusted files.
            reason = next((line for line in str(err).splitlines() if "GLOBAL" in line), "")
            raise UnsafeCheckpointError(
                f"checkpoint entry {fqn!r} holds a Python object that only a full unpickler could "
                f"build ({reason.strip() or 'not plain data'}); refusing to load it, nothing from "
                "it was executed. Checkpointed state must be made of tensors, numbers, strings, "
                "lists, tuples and dicts"
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj
