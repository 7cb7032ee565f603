"""trainkit.checkpoint: elastic sharded checkpoints on torch.distributed.checkpoint."""

from trainkit.checkpoint._checkpointer import Checkpointer, CheckpointerConfig, list_checkpoints
from trainkit.checkpoint._errors import (
    CheckpointError,
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
    "open_storage",
    "resolve_checkpoint",
    "save_checkpoint",
    "verify_checkpoint",
]
