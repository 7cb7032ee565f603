"""trainkit.checkpoint: elastic sharded checkpoints on torch.distributed.checkpoint."""

from trainkit.checkpoint._checkpointer import Checkpointer, list_checkpoints
from trainkit.checkpoint._errors import CheckpointError, UnsafeCheckpointError
from trainkit.checkpoint._io import (
    PendingSave,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)
from trainkit.checkpoint._manifest import Manifest

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "Manifest",
    "PendingSave",
    "UnsafeCheckpointError",
    "list_checkpoints",
    "load_checkpoint",
    "resolve_checkpoint",
    "save_checkpoint",
]
