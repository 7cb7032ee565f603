"""trainkit.checkpoint: elastic sharded checkpoints on torch.distributed.checkpoint."""

from trainkit.checkpoint._checkpointer import Checkpointer, CheckpointerConfig, list_checkpoints
from trainkit.checkpoint._composer import load_torch_file
from trainkit.checkpoint._errors import (
    CheckpointError,
    CheckpointExistsError,
    MissingAlgorithmError,
    StorageError,
    UnsafeCheckpointError,
)
from trainkit.checkpoint._load import load_checkpoint, resolve_checkpoint
from trainkit.checkpoint._manifest import Manifest
from trainkit.checkpoint._s3 import S3Storage
from trainkit.checkpoint._save import PendingSave, save_checkpoint
from trainkit.checkpoint._storage import LocalStorage, Storage, open_storage
from trainkit.checkpoint._tools import export_checkpoint, inspect_checkpoint, verify_checkpoint

__all__ = [
    "CheckpointError",
    "CheckpointExistsError",
    "Checkpointer",
    "CheckpointerConfig",
    "LocalStorage",
    "Manifest",
    "MissingAlgorithmError",
    "PendingSave",
    "S3Storage",
    "Storage",
    "StorageError",
    "UnsafeCheckpointError",
    "export_checkpoint",
    "inspect_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "load_torch_file",
    "open_storage",
    "resolve_checkpoint",
    "save_checkpoint",
    "verify_checkpoint",
]
