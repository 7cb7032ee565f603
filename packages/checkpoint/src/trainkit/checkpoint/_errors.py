"""Errors raised by trainkit.checkpoint."""

__all__ = [
    "CheckpointError",
    "CheckpointExistsError",
    "MissingAlgorithmError",
    "StorageError",
    "UnsafeCheckpointError",
]


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, corrupted, or does not fit the run."""


class CheckpointExistsError(CheckpointError):
    """A save would replace an existing checkpoint (or folder) and overwriting was not allowed;
    nothing was written."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file carries something that would run code when loaded; nothing was run."""


class StorageError(CheckpointError):
    """The storage could not be reached or refused a request; the checkpoint itself may be fine."""


class MissingAlgorithmError(CheckpointError):
    """The checkpoint was saved by a run with an algorithm that changes the model's structure
    (``required_on_load``), and the loading run does not have it."""
