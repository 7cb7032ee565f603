"""trainkit.checkpoint: elastic sharded checkpoints on torch.distributed.checkpoint."""

from trainkit.checkpoint._checkpointer import Checkpointer, CheckpointerConfig
from trainkit.checkpoint._composer import load_torch_file
from trainkit.checkpoint._errors import (
    CheckpointError,
    CheckpointExistsError,
    FolderLockedError,
    FolderOfAnotherModelError,
    MissingAlgorithmError,
    StorageError,
    UnsafeCheckpointError,
    UnsafePathError,
)
from trainkit.checkpoint._export import export, export_checkpoint
from trainkit.checkpoint._export_callback import ExportOnFitEnd, ExportOnFitEndConfig
from trainkit.checkpoint._fsspec import FsspecStorage
from trainkit.checkpoint._listing import list_checkpoints
from trainkit.checkpoint._load import load_checkpoint, resolve_checkpoint
from trainkit.checkpoint._lock import FolderLock
from trainkit.checkpoint._manifest import Manifest
from trainkit.checkpoint._s3 import S3Storage
from trainkit.checkpoint._save import PendingSave, save_checkpoint
from trainkit.checkpoint._storage import ConditionalStorage, LocalStorage, Storage, open_storage
from trainkit.checkpoint._tools import inspect_checkpoint, verify_checkpoint
from trainkit.checkpoint._write import SaveAbandoned

__all__ = [
    "CheckpointError",
    "CheckpointExistsError",
    "Checkpointer",
    "CheckpointerConfig",
    "ConditionalStorage",
    "ExportOnFitEnd",
    "ExportOnFitEndConfig",
    "FolderLock",
    "FolderLockedError",
    "FolderOfAnotherModelError",
    "FsspecStorage",
    "LocalStorage",
    "Manifest",
    "MissingAlgorithmError",
    "PendingSave",
    "S3Storage",
    "SaveAbandoned",
    "Storage",
    "StorageError",
    "UnsafeCheckpointError",
    "UnsafePathError",
    "export",
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
