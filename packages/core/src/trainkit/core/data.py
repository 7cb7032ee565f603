"""Data: `DataSpec` (counting, splitting, moving batches) and the resumable sampler."""

from trainkit.core._data import DataSpec, ResumableBatchSampler, default_split_batch, to_device

__all__ = ["DataSpec", "ResumableBatchSampler", "default_split_batch", "to_device"]
