"""Errors raised by trainkit.checkpoint."""

__all__ = ["CheckpointError", "StorageError", "UnsafeCheckpointError"]


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, corrupted, or does not fit the run."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file carries something that would run code when loaded; nothing was run."""


class StorageError(CheckpointError):
    """The storage could not be reached or refused a request; the checkpoint itself may be fine."""
