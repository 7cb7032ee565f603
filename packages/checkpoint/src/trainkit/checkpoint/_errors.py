"""Errors raised by trainkit.checkpoint."""

__all__ = [
    "CheckpointError",
    "CheckpointExistsError",
    "FolderLockedError",
    "FolderOfAnotherModelError",
    "MissingAlgorithmError",
    "StorageError",
    "UnsafeCheckpointError",
    "UnsafePathError",
]


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, corrupted, or does not fit the run."""


class CheckpointExistsError(CheckpointError):
    """A save would replace an existing checkpoint (or folder) and overwriting was not allowed;
    nothing was written."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file carries something unsafe to load (code that would run, a path out of
    its folder); nothing of it was run or read."""


class UnsafePathError(UnsafeCheckpointError):
    """A checkpoint or a storage names a path outside its folder (absolute, with ``..``, a
    symbolic link), or a file that is not a regular file (a FIFO, a device); it was neither
    read nor deleted."""


class FolderLockedError(CheckpointError):
    """Another run holds the checkpoint folder; nothing was written."""


class FolderOfAnotherModelError(CheckpointError):
    """The checkpoint folder holds checkpoints of a model of another shape (another run's);
    nothing was read or written there."""


class StorageError(CheckpointError):
    """The storage could not be reached or refused a request; the checkpoint itself may be fine."""


class MissingAlgorithmError(CheckpointError):
    """The checkpoint was saved by a run with an algorithm that changes the model's structure
    (``required_on_load``), and the loading run does not have it."""
