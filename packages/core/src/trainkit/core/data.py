"""Data: how `trainkit.core.DataSpec` counts, splits and moves batches, and the resumable
positions of loaders (MosaicML Streaming's among them; trainkit-trainer writes and reads
the shards)."""

from trainkit.core._data import (
    default_num_samples,
    default_num_tokens,
    default_split_batch,
    to_device,
)
from trainkit.core._data_position import (
    DataPosition,
    LoaderState,
    ReplayPosition,
    ResumableBatchSampler,
    SamplerPosition,
    StatefulLoader,
)
from trainkit.core._state import check_microbatch_size_value, check_subset_num_batches
from trainkit.core._streaming import StreamingPosition

__all__ = [
    "DataPosition",
    "LoaderState",
    "ReplayPosition",
    "ResumableBatchSampler",
    "SamplerPosition",
    "StatefulLoader",
    "StreamingPosition",
    "check_microbatch_size_value",
    "check_subset_num_batches",
    "default_num_samples",
    "default_num_tokens",
    "default_split_batch",
    "to_device",
]
