"""Data: `DataSpec` (counting, splitting, moving batches), the resumable positions of
loaders, and MosaicML Streaming's MDS shards (`write_mds`, `streaming_loader`)."""

from trainkit.core._data import (
    DataSpec,
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
from trainkit.core._streaming import StreamingPosition, collate_mds, streaming_loader, write_mds

__all__ = [
    "DataPosition",
    "DataSpec",
    "LoaderState",
    "ReplayPosition",
    "ResumableBatchSampler",
    "SamplerPosition",
    "StatefulLoader",
    "StreamingPosition",
    "collate_mds",
    "default_num_samples",
    "default_num_tokens",
    "default_split_batch",
    "streaming_loader",
    "to_device",
    "write_mds",
]
