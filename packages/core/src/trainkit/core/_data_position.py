"""`DataPosition`: where a loader is in its data, and how a run gets back there on resume.

A `DataSpec` holds one position object, chosen for its loader when the run starts:

- a map-style `DataLoader`: `SamplerPosition` (the order is fixed by seed and epoch; the
  batches already trained on are skipped as index lists, no sample is loaded);
- a `StreamingDataset` (MosaicML Streaming): `trainkit.core._streaming.StreamingPosition`
  (the global sample position, restorable on any number of ranks and workers);
- any other loader with ``state_dict()`` / ``load_state_dict()`` (torchdata's
  `StatefulDataLoader`, ...): `LoaderState`, which checkpoints that state for every rank;
- anything else: `ReplayPosition`, which skips the trained batches by iterating them.

A user's own kind of data implements `DataPosition` and passes it as
``DataSpec(loader, position=...)``.
"""

from __future__ import annotations

import array
import hashlib
import itertools
import operator
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from trainkit.core import dist
from trainkit.core._rng import seed_everything
from trainkit.core.messages import warn

__all__ = [
    "DataPosition",
    "EpochSeeds",
    "LoaderState",
    "ReplayPosition",
    "ResumableBatchSampler",
    "SamplerPosition",
    "StatefulLoader",
]

Batch = Any


@runtime_checkable
class StatefulLoader(Protocol):
    """A loader that saves and restores its own position (torchdata's `StatefulDataLoader`,
    streaming's `StreamingDataLoader`, ...)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class DataPosition:
    """Where a loader is in its data: how an epoch is iterated from a given point, and what
    a checkpoint must hold to come back to it.

    Every rank's `state_dict` is saved (`DataSpec.state_dict` gathers them). On resume with
    as many ranks, each rank gets its own back; with another number of ranks, only an
    ``elastic`` position is restored (every rank gets the one position they all saved),
    any other is an error.
    """

    elastic: bool = False
    """The position is global (the same on every rank, e.g. a sample offset into one
    order shared by all ranks), so a run may resume on another number of ranks."""

    def prepare(self, loader: Iterable[Batch], seed: int) -> Iterable[Batch]:
        """Called once when the run starts; returns what to iterate (default: ``loader``)."""
        return loader

    def iter_epoch(self, loader: Iterable[Batch], epoch: int, batches_done: int) -> Iterator[Batch]:
        """Iterate epoch ``epoch`` of ``loader`` after its first ``batches_done`` batches."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """This rank's position, as plain data and tensors (default: nothing to save)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (on another rank, if ``elastic``)."""


class ResumableBatchSampler:
    """Wraps a DataLoader's batch sampler (or, with automatic batching off,
    ``batch_size=None``, its sampler, each index a whole batch): order fixed by (seed,
    epoch), and a skip count.

    The skipped batches are index lists only: no sample is loaded to get past them, so a
    run resumes mid-epoch at the cost of drawing the epoch's permutation once. With
    ``seed_batches`` each batch comes as a `SeededBatch` (or `SeededIndex`), its seed fixed
    by (seed, epoch, batch number, the batch's indices), for `SeedEachBatch` to seed the
    worker that loads it. The indices, not the rank: ranks that read the same batch (a
    tensor-parallel group) augment it alike, ranks that read their own slice differently.
    """

    def __init__(
        self,
        batch_sampler: Iterable[Any],
        seed: int,
        *,
        seed_batches: bool = False,
        each_index_a_batch: bool = False,
    ):
        self.batch_sampler = batch_sampler
        self.seed = seed
        self.seed_batches = seed_batches
        self.each_index_a_batch = each_index_a_batch
        self.epoch = 0
        self.skip = 0

    def set_position(self, epoch: int, batches_done: int) -> None:
        self.epoch, self.skip = epoch, batches_done

    def __iter__(self) -> Iterator[list[int]]:
        # A generator, so nothing happens (the skip is not used up) until the first batch is
        # asked for: a DataLoader with workers calls iter() on its sampler twice and
        # iterates only the second. The sampler to seed: a BatchSampler's, or the wrapped
        # one itself (a batch sampler of the user's own, or automatic batching off).
        sampler = getattr(self.batch_sampler, "sampler", self.batch_sampler)
        if hasattr(sampler, "set_epoch"):  # DistributedSampler and friends
            sampler.set_epoch(self.epoch)
        elif hasattr(sampler, "generator"):  # RandomSampler, SubsetRandomSampler, ...
            sampler.generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        skip, self.skip = self.skip, 0
        batches = itertools.islice(iter(self.batch_sampler), skip, None)
        if not self.seed_batches:
            yield from batches
            return
        prefix = f"{self.seed}/{self.epoch}/"
        for number, batch in enumerate(batches, start=skip):
            if not self.each_index_a_batch:
                batch = list(batch)
                yield SeededBatch(batch, _batch_seed(prefix, number, batch))
            elif hasattr(batch, "__index__"):  # an int, a NumPy integer, ...
                index = operator.index(batch)
                yield SeededIndex(index, _batch_seed(prefix, number, [index]))
            else:
                yield batch  # a key of another kind: loaded as it is, unseeded

    def __len__(self) -> int:
        return len(self.batch_sampler)  # type: ignore[arg-type]


class SeededBatch(list):
    """A batch's sample indices, with the seed its worker draws the batch's random numbers
    from (``seed``)."""

    def __init__(self, indices: Iterable[int], seed: int):
        super().__init__(indices)
        self.seed = seed


class SeededIndex(int):
    """One index that is a whole batch (automatic batching off), with its batch's seed."""

    seed: int

    def __new__(cls, index: int, seed: int) -> SeededIndex:
        obj = super().__new__(cls, index)
        obj.seed = seed
        return obj

    def __getnewargs__(self) -> tuple[int, int]:  # type: ignore[override]
        return int(self), self.seed


def _batch_seed(prefix: str, number: int, indices: list[Any]) -> int:
    digest = hashlib.blake2b(f"{prefix}{number}/".encode(), digest_size=4)  # a 32-bit seed
    try:
        digest.update(array.array("q", indices).tobytes())
    except (TypeError, OverflowError):  # keys other than integers
        digest.update(repr(indices).encode())
    return int.from_bytes(digest.digest(), "little")


class SeedEachBatch(Dataset):
    """A map-style dataset whose random numbers belong to the batch, not to the worker.

    A DataLoader worker seeds torch, Python's ``random`` and NumPy once, when it starts,
    and then draws from them for every sample it loads: which numbers a sample's random
    augmentation gets depends on what that worker loaded before. Skipping trained batches
    without loading them (`SamplerPosition`), or starting the workers afresh on resume,
    changes that, so a resumed run would augment differently from an uninterrupted one.
    Here a worker seeds its generators from the batch's seed (`SeededBatch`, or
    `SeededIndex` when each index is a batch) before loading it: a batch's augmentations
    are the same whichever worker loads it, how many workers there are, and whether the
    run resumed.
    """

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __getitems__(self, indices: list[int]) -> list[Any]:
        _seed_from(indices)
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is not None:
            return getitems(list(indices))  # the plain list a dataset gets without workers
        return [self.dataset[index] for index in indices]

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, SeededIndex):  # a whole batch (automatic batching off)
            _seed_from(index)
            index = int(index)
        return self.dataset[index]

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # not set yet (while unpickling in a spawned worker)
            raise AttributeError(name)
        return getattr(self.dataset, name)


def _seed_from(batch: Any) -> None:
    seed = getattr(batch, "seed", None)
    if seed is not None:
        seed_everything(seed)


def _set_epoch(loader: Any, epoch: int) -> None:
    sampler = getattr(loader, "sampler", None)
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)


class EpochSeeds:
    """Gives a `DataLoader` without a ``generator`` one of its own, seeded by (seed, epoch)
    before each epoch.

    Iterating a DataLoader draws its workers' base seed from its generator, or from the
    global RNG when it has none: a resumed run would draw at another point of the global
    stream than the uninterrupted run did, and its random numbers (dropout, ...) diverge.
    """

    def __init__(self, loader: Any, seed: int):
        self.generator: torch.Generator | None = None
        self.seed = seed
        if isinstance(loader, DataLoader) and loader.generator is None:
            self.generator = loader.generator = torch.Generator()

    def start(self, epoch: int) -> None:
        if self.generator is not None:
            self.generator.manual_seed(self.seed * 1_000_003 + epoch)


class _CountedPosition(DataPosition):
    """A position that is the run's per-rank batch count: restored from the timestamp.

    Elastic only between epochs: mid-epoch on another number of ranks, each rank skips as
    many batches as each saved rank had trained, which repeats or drops some of the
    epoch's samples (a warning says so).
    """

    elastic = True

    def __init__(self) -> None:
        self._saved_world_size: int | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"world_size": dist.get_world_size()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._saved_world_size = state.get("world_size")

    def _check_world(self, batches_done: int) -> None:
        saved, self._saved_world_size = self._saved_world_size, None
        world = dist.get_world_size()
        if batches_done and saved is not None and saved != world:
            warn(
                f"resuming mid-epoch on {world} ranks from a run on {saved}: "
                f"{type(self).__name__} positions each rank by its batch count, so some of "
                "this epoch's samples are seen twice or not at all (exact from the next "
                "epoch on). Resume on the same number of ranks, or use data whose position "
                "is global (a StreamingDataset)",
            )


class SamplerPosition(_CountedPosition):
    """A map-style `DataLoader`: its batch sampler is wrapped in a `ResumableBatchSampler`."""

    def __init__(self) -> None:
        super().__init__()
        self._sampler: ResumableBatchSampler | None = None

    def prepare(self, loader: Iterable[Batch], seed: int) -> Iterable[Batch]:
        if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
            raise TypeError(
                f"SamplerPosition needs a DataLoader over a map-style dataset, got "
                f"{type(loader).__name__}"
            )
        rebuilt, self._sampler = _resumable_loader(loader, seed)
        return rebuilt

    def iter_epoch(self, loader: Iterable[Batch], epoch: int, batches_done: int) -> Iterator[Batch]:
        assert self._sampler is not None, "iter_epoch before prepare"
        self._check_world(batches_done)
        self._sampler.set_position(epoch, batches_done)
        return iter(loader)


class ReplayPosition(_CountedPosition):
    """Any iterable: a resumed epoch is iterated from its start, skipping the batches
    already trained on (they are read again: a warning says so once)."""

    def __init__(self) -> None:
        super().__init__()
        self._warned = False
        self._seeds: EpochSeeds | None = None

    def prepare(self, loader: Iterable[Batch], seed: int) -> Iterable[Batch]:
        self._seeds = EpochSeeds(loader, seed)
        return loader

    def iter_epoch(self, loader: Iterable[Batch], epoch: int, batches_done: int) -> Iterator[Batch]:
        self._check_world(batches_done)
        _set_epoch(loader, epoch)
        if self._seeds is not None:
            self._seeds.start(epoch)
        iterator = iter(loader)
        if batches_done:
            if not self._warned:
                self._warned = True
                warn(
                    f"resuming mid-epoch on a {type(loader).__name__}, which trainkit cannot "
                    f"position directly: skipping {batches_done} batches by iterating them. "
                    "Use a map-style DataLoader, a loader with state_dict() / "
                    "load_state_dict(), or a StreamingDataset to resume without reading the "
                    "skipped data",
                )
            iterator = itertools.islice(iterator, batches_done, None)
        return iterator


class LoaderState(DataPosition):
    """A loader with its own ``state_dict()`` / ``load_state_dict()``: that state is saved
    for every rank and handed back to the same rank on resume.

    Args:
        elastic: the loader's state is global (every rank's is the same and means the same
            on any number of ranks), so it may be restored on another number of ranks.
            torchdata's `StatefulDataLoader` keeps a per-rank, per-worker position: it is
            not elastic (resume it on as many ranks and workers).
    """

    def __init__(self, *, elastic: bool = False):
        self.elastic = elastic
        self._loader: StatefulLoader | None = None
        self._pending: dict[str, Any] | None = None

    def prepare(self, loader: Iterable[Batch], seed: int) -> Iterable[Batch]:
        if not isinstance(loader, StatefulLoader):
            raise TypeError(
                f"LoaderState needs a loader with state_dict() and load_state_dict(), got "
                f"{type(loader).__name__}"
            )
        self._loader = loader
        if self._pending is not None:
            loader.load_state_dict(self._pending)
            self._pending = None
        return loader

    def iter_epoch(self, loader: Iterable[Batch], epoch: int, batches_done: int) -> Iterator[Batch]:
        _set_epoch(loader, epoch)
        return iter(loader)  # the loader continues from its own (restored) state

    def state_dict(self) -> dict[str, Any]:
        return {"loader": self._loader.state_dict()} if self._loader is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "loader" not in state:
            return
        if self._loader is None:
            self._pending = state["loader"]
        else:
            self._loader.load_state_dict(state["loader"])


def _resumable_loader(loader: DataLoader, seed: int) -> tuple[DataLoader, ResumableBatchSampler]:
    # Workers draw a batch's random numbers from its own seed (SeedEachBatch); in the main
    # process they come from the global generators, which checkpoints save and restore.
    workers = loader.num_workers > 0
    batched = loader.batch_sampler is not None  # batch_size=None: every index is a batch
    indices = loader.batch_sampler if batched else loader.sampler
    sampler = ResumableBatchSampler(
        indices, seed, seed_batches=workers, each_index_a_batch=not batched
    )
    rebuilt = DataLoader(
        SeedEachBatch(loader.dataset) if workers else loader.dataset,
        **({"batch_sampler": sampler} if batched else {"sampler": sampler, "batch_size": None}),
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        # A private generator: iterating a DataLoader draws a worker seed, and drawing it
        # from the global RNG would make a resumed run diverge from an uninterrupted one.
        generator=torch.Generator().manual_seed(seed),
        prefetch_factor=loader.prefetch_factor if loader.num_workers > 0 else None,
        persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device,
        in_order=getattr(loader, "in_order", True),
    )
    return rebuilt, sampler
