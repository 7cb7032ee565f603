"""The resumable position of a MosaicML Streaming `StreamingDataset`, saved and restored
with the run (trainkit-trainer's `trainkit.trainer.streaming` writes and reads MDS shards).

Never imports the ``streaming`` module: a loader holds a `StreamingDataset` only where the
program imported it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from torch.utils.data import DataLoader

from trainkit.core import dist
from trainkit.core._data_position import DataPosition, EpochSeeds
from trainkit.core.messages import warn

__all__ = ["StreamingPosition"]

_CONFIG_KEYS = ("num_canonical_nodes", "shuffle_seed", "initial_physical_nodes")


class StreamingPosition(DataPosition):
    """The position of a `StreamingDataset`: the epoch and how many samples of it all ranks
    together have trained on.

    Streaming orders each epoch's samples once for the whole job (by its seed and its
    ``num_canonical_nodes``, both saved with the position), so the position means the same
    on any number of ranks and data-loader workers: a run resumes on another number
    (``elastic``) and reads only the samples it has not trained on. The position is set
    explicitly before every epoch, so the dataset's own epoch counter never drifts from
    the run's.
    """

    elastic = True

    def __init__(self) -> None:
        self.epoch = 0
        self.sample_in_epoch = 0
        self._config: dict[str, Any] | None = None
        self._dataset: Any = None
        self._samples_per_batch = 0
        self._seeds: EpochSeeds | None = None

    def prepare(self, loader: Iterable[Any], seed: int) -> Iterable[Any]:
        assert isinstance(loader, DataLoader), "StreamingPosition is for a DataLoader"
        dataset = loader.dataset
        if dataset.batch_size != loader.batch_size:
            raise ValueError(
                f"StreamingDataset(batch_size={dataset.batch_size!r}) must equal the "
                f"DataLoader's batch_size ({loader.batch_size!r}): streaming splits each epoch "
                "into per-rank batches of that size, and the position is counted in them"
            )
        from streaming.base import distributed as streaming_world

        theirs = (streaming_world.get_rank(), streaming_world.get_world_size())
        ours = (dist.get_rank(), dist.get_world_size())
        if theirs != ours:
            raise ValueError(
                f"the StreamingDataset sees rank {theirs[0]} of {theirs[1]} but this process is "
                f"rank {ours[0]} of {ours[1]}: streaming reads RANK, WORLD_SIZE, LOCAL_RANK and "
                "LOCAL_WORLD_SIZE from the environment; launch with torchrun (`trainkit "
                "launch`), or set them before building the dataset"
            )
        replication = dataset.replication or 1
        self._samples_per_batch = loader.batch_size * ours[1] // replication
        self._dataset = dataset
        self._seeds = EpochSeeds(loader, seed)
        self._config = self._current_config()
        # Reading the config reads the dataset's resume record, which every rank of a node
        # shares and rewrites before each epoch: no rank may write it before all have read.
        dist.barrier()
        return loader

    def iter_epoch(self, loader: Iterable[Any], epoch: int, batches_done: int) -> Iterator[Any]:
        if not batches_done:
            self.epoch, self.sample_in_epoch = epoch, 0
        elif self.epoch != epoch:
            warn(
                f"resuming epoch {epoch} at batch {batches_done} without a saved streaming "
                "position (the checkpoint has no data state): assuming it was saved on this "
                "number of ranks",
            )
            self.epoch, self.sample_in_epoch = epoch, batches_done * self._samples_per_batch
        self._seek()
        if self._seeds is not None:
            self._seeds.start(epoch)
        return self._counted(iter(loader))

    def _seek(self) -> None:
        dataset = self._dataset
        assert self._config is not None, "iter_epoch before prepare"
        if dataset.next_epoch != self.epoch:
            dataset.next_epoch = self.epoch
        dataset.load_state_dict(
            {"epoch": self.epoch, "sample_in_epoch": self.sample_in_epoch, **self._config}
        )

    def _current_config(self) -> dict[str, Any]:
        # The dataset resolves num_canonical_nodes (when not given) the first time it is asked.
        state = self._dataset.state_dict(num_samples=0, from_beginning=True)
        return {key: state[key] for key in _CONFIG_KEYS}

    def _counted(self, iterator: Iterator[Any]) -> Iterator[Any]:
        for batch in iterator:
            self.sample_in_epoch += self._samples_per_batch  # counted once handed to the loop
            yield batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "sample_in_epoch": self.sample_in_epoch,
            **(self._config or {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.sample_in_epoch = int(state["epoch"]), int(state["sample_in_epoch"])
        # The saved order (seed, canonical nodes) wins over this dataset's arguments.
        self._config = {**(self._config or {}), **{k: state[k] for k in _CONFIG_KEYS if k in state}}
