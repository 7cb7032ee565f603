"""`ReplicaBatches`: a replica group's batches, drawn after each step's quorum.

All groups read one order of the epoch's samples (shuffled by seed and epoch) and keep one
position in it: the samples that committed steps have used. At each step the groups in the
quorum split the next ``participants * batch_size`` samples; the position moves on only
when the step is committed, so a failed step's samples come again in the next step (split
over the groups present then) and no sample is used twice or left out within an epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler

__all__ = ["ReplicaBatches"]

QuorumView = Callable[[], tuple[int, int]]
"""Starts the step's quorum; returns this group's rank in it and the number of groups."""


class ReplicaBatches:
    """A map-style `DataLoader`'s batches for one replica group of a fault-tolerant run.

    Args:
        loader: the run's training `DataLoader` (map-style, ``num_workers=0``, a
            ``batch_size``): its dataset, batch size, collate function and whether it
            shuffles are kept; ``batch_size`` is per replica group.
        quorum: starts each step's quorum (it may load a healthy group's state into this
            one, this position included) and returns (rank, groups).
        seed: the order's seed (a recovering group gets its peers').
    """

    def __init__(self, loader: DataLoader, quorum: QuorumView, seed: int) -> None:
        _check_loader(loader)
        self.dataset = loader.dataset
        self.batch_size: int = loader.batch_size  # type: ignore[assignment]
        self.collate_fn = loader.collate_fn
        self.shuffle = isinstance(loader.sampler, RandomSampler)
        self.seed, self.epoch, self.offset = seed, 0, 0
        self.groups = 1
        """Groups in the latest quorum (for `__len__`)."""
        self._quorum = quorum
        self._order: tuple[tuple[int, int], list[int]] | None = None
        self._step = (0, 0)  # (samples this step over all groups, this group's)

    def __len__(self) -> int:
        """Steps per epoch if the latest quorum's groups stay (an estimate: groups change)."""
        step = self.batch_size * max(1, self.groups)
        return max(1, -(-len(self.dataset) // step))  # type: ignore[arg-type]

    @property
    def local_share(self) -> float:
        """This group's part of the current step's samples (weights its gradient)."""
        total, mine = self._step
        return mine / total if total else 0.0

    def __iter__(self) -> Iterator[Any]:
        size = len(self.dataset)  # type: ignore[arg-type]
        while True:
            if self.offset >= size:
                self.epoch, self.offset = self.epoch + 1, 0
                return
            rank, groups = self._quorum()  # may replace seed, epoch and offset (recovery)
            self.groups = groups
            take = min(groups * self.batch_size, size - self.offset)
            if take < groups:
                # Fewer samples than groups: the epoch ends here, as with drop_last, on every
                # group alike (they all see the same quorum and position).
                self.offset = size
                continue
            chunk = self._epoch_order(size)[self.offset : self.offset + take]
            mine = chunk[rank * take // groups : (rank + 1) * take // groups]
            self._step = (take, len(mine))
            yield self.collate_fn([self.dataset[index] for index in mine])

    def commit(self) -> None:
        """The step was taken on every group: its samples are used."""
        self.offset += self._step[0]

    def state_dict(self) -> dict[str, int]:
        """The position: shared by all groups, so it is elastic."""
        return {"seed": self.seed, "epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed, self.epoch, self.offset = (int(state[k]) for k in ("seed", "epoch", "offset"))

    def _epoch_order(self, size: int) -> list[int]:
        key = (self.seed, self.epoch)
        if self._order is None or self._order[0] != key:
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
                order = torch.randperm(size, generator=generator).tolist()
            else:
                order = list(range(size))
            self._order = (key, order)
        return self._order[1]


def _check_loader(loader: Any) -> None:
    what = "the fault-tolerant strategy's training data"
    if not isinstance(loader, DataLoader):
        raise TypeError(
            f"{what} must be a torch DataLoader over a map-style dataset, got "
            f"{type(loader).__name__}: the groups draw their samples from one shared order"
        )
    if isinstance(loader.dataset, IterableDataset) or not hasattr(loader.dataset, "__len__"):
        raise TypeError(
            f"{what} must be a map-style dataset with a length, got {type(loader.dataset).__name__}"
        )
    if loader.batch_size is None:
        raise ValueError(f"{what} needs a DataLoader batch_size (samples per group and step)")
    if not isinstance(loader.sampler, RandomSampler | SequentialSampler):
        raise ValueError(
            f"{what} must use shuffle=True or False, not a sampler of its own "
            f"({type(loader.sampler).__name__}): the strategy shards the samples itself"
        )
    if loader.num_workers:
        raise ValueError(
            f"{what} must load in the main process (num_workers=0, got "
            f"{loader.num_workers}): each batch is chosen after the step's quorum, and "
            "workers would read batches ahead, before the groups present are known"
        )
