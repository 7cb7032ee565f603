"""`DataSpec`: how the loop counts, splits and moves batches, and resumes mid-epoch."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

__all__ = ["DataSpec", "ResumableBatchSampler", "default_split_batch", "to_device"]

Batch = Any
_UNKNOWN = object()


def to_device(batch: Batch, device: torch.device) -> Batch:
    """Move every tensor in a (nested) tuple / list / dict batch to ``device``."""
    # Concrete types first: isinstance against the Mapping ABC is slow, and this runs per step.
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if type(batch) in (tuple, list):
        return type(batch)([to_device(v, device) for v in batch])
    if type(batch) is dict:
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, Mapping):
        return type(batch)({k: to_device(v, device) for k, v in batch.items()})
    if isinstance(batch, list | tuple):
        return type(batch)(to_device(v, device) for v in batch)
    if hasattr(batch, "to") and callable(batch.to):  # e.g. transformers' BatchEncoding
        return batch.to(device)
    return batch


def _first_tensor(batch: Batch) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    if type(batch) in (tuple, list) and batch and isinstance(batch[0], torch.Tensor):
        return batch[0]  # the common (inputs, targets) batch, without the general walk
    values = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(values, Iterable) and not isinstance(values, str | bytes):
        for value in values:
            if (found := _first_tensor(value)) is not None:
                return found
    return None


def default_num_samples(batch: Batch) -> int:
    """Size of dim 0 of the first tensor in the batch."""
    tensor = _first_tensor(batch)
    if tensor is None or tensor.ndim == 0:
        raise ValueError(
            f"cannot tell how many samples a batch of type {type(batch).__name__} holds; "
            "pass DataSpec(get_num_samples_in_batch=...)"
        )
    return tensor.shape[0]


def default_num_tokens(batch: Batch) -> int:
    """Tokens in a dict batch with ``input_ids`` (non-padding when an attention mask is present)."""
    if type(batch) in (tuple, list) or isinstance(batch, torch.Tensor):
        return 0
    if isinstance(batch, Mapping) and "input_ids" in batch:
        mask = batch.get("attention_mask")
        return int(mask.sum()) if isinstance(mask, torch.Tensor) else batch["input_ids"].numel()
    return 0


def default_split_batch(batch: Batch, microbatch_size: int) -> list[Batch]:
    """Split along dim 0 into chunks of ``microbatch_size`` (the last may be smaller)."""
    if isinstance(batch, torch.Tensor):
        return list(batch.split(microbatch_size))
    if isinstance(batch, Mapping):
        parts = {k: default_split_batch(v, microbatch_size) for k, v in batch.items()}
        count = _common_count(parts.values(), batch)
        return [type(batch)({k: v[i] for k, v in parts.items()}) for i in range(count)]
    if isinstance(batch, list | tuple):
        parts_list = [default_split_batch(v, microbatch_size) for v in batch]
        count = _common_count(parts_list, batch)
        build = (lambda xs: type(batch)(*xs)) if hasattr(batch, "_fields") else type(batch)
        return [build([p[i] for p in parts_list]) for i in range(count)]
    raise TypeError(
        f"cannot split a batch element of type {type(batch).__name__} into microbatches; "
        "pass DataSpec(split_batch=...) or use tensors, tuples, lists or dicts of them"
    )


def _common_count(parts: Iterable[Sequence[Any]], batch: Batch) -> int:
    counts = {len(p) for p in parts}
    if len(counts) != 1:
        raise ValueError(
            f"batch elements have different sizes along dim 0 ({sorted(counts)} microbatches); "
            f"cannot split {type(batch).__name__} evenly"
        )
    return counts.pop()


class ResumableBatchSampler:
    """Wraps a DataLoader's batch sampler: order fixed by (seed, epoch), and a skip count.

    The skipped batches are index lists only: no sample is loaded to get past them, so a
    run resumes mid-epoch at the cost of drawing the epoch's permutation once.
    """

    def __init__(self, batch_sampler: Iterable[list[int]], seed: int):
        self.batch_sampler = batch_sampler
        self.seed = seed
        self.epoch = 0
        self.skip = 0

    def set_position(self, epoch: int, batches_done: int) -> None:
        self.epoch, self.skip = epoch, batches_done

    def __iter__(self) -> Iterator[list[int]]:
        sampler = getattr(self.batch_sampler, "sampler", None)
        if hasattr(sampler, "set_epoch"):  # DistributedSampler and friends
            sampler.set_epoch(self.epoch)
        elif hasattr(sampler, "generator"):  # RandomSampler, SubsetRandomSampler, ...
            sampler.generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        skip, self.skip = self.skip, 0
        return itertools.islice(iter(self.batch_sampler), skip, None)

    def __len__(self) -> int:
        return len(self.batch_sampler)  # type: ignore[arg-type]


def _resumable_loader(loader: DataLoader, seed: int) -> tuple[DataLoader, ResumableBatchSampler]:
    sampler = ResumableBatchSampler(loader.batch_sampler, seed)
    rebuilt = DataLoader(
        loader.dataset,
        batch_sampler=sampler,
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


class DataSpec:
    """Wraps any iterable of batches and says how to handle its batches.

    Args:
        dataloader: a `DataLoader` or any re-iterable of batches.
        num_samples: samples per epoch, if known (defaults to ``len(dataset)``).
        get_num_samples_in_batch: batch -> samples (default: dim 0 of the first tensor).
        get_num_tokens_in_batch: batch -> tokens (default: ``input_ids`` in dict batches).
        split_batch: ``(batch, microbatch_size) -> list`` (default: split along dim 0).
        device_transfer: ``(batch, device) -> batch`` (default: move every tensor).
    """

    def __init__(
        self,
        dataloader: Iterable[Batch],
        *,
        num_samples: int | None = None,
        get_num_samples_in_batch: Callable[[Batch], int] | None = None,
        get_num_tokens_in_batch: Callable[[Batch], int] | None = None,
        split_batch: Callable[[Batch, int], Sequence[Batch]] | None = None,
        device_transfer: Callable[[Batch, torch.device], Batch] | None = None,
    ):
        if not isinstance(dataloader, Iterable):
            raise TypeError(f"dataloader must be iterable, got {type(dataloader).__name__}")
        self.dataloader = dataloader
        self.num_samples = num_samples
        if num_samples is None and isinstance(dataloader, DataLoader):
            dataset = dataloader.dataset
            if not isinstance(dataset, IterableDataset) and hasattr(dataset, "__len__"):
                self.num_samples = len(dataset)  # type: ignore[arg-type]
        self.get_num_samples_in_batch = get_num_samples_in_batch or default_num_samples
        self.get_num_tokens_in_batch = get_num_tokens_in_batch or default_num_tokens
        self.split_batch = split_batch or default_split_batch
        self.device_transfer = device_transfer or to_device
        self._resumable: ResumableBatchSampler | None = None
        self._loader: Iterable[Batch] = dataloader
        self._warned_replay = False
        self._length: int | object | None = _UNKNOWN

    def __len__(self) -> int:
        """Batches per epoch. Raises `TypeError` when the iterable has no length."""
        return len(self.dataloader)  # type: ignore[arg-type]

    @property
    def length(self) -> int | None:
        """Batches per epoch, or None; read once per epoch (the loop asks every step)."""
        if self._length is _UNKNOWN:
            try:
                self._length = len(self)
            except TypeError:
                self._length = None
        return self._length  # type: ignore[return-value]

    def make_resumable(self, seed: int) -> None:
        """Fix the shuffle order by (seed, epoch) so a run can resume at any batch.

        Map-style `DataLoader`s get a `ResumableBatchSampler`; loaders with their own
        ``state_dict`` are trusted to resume themselves; anything else resumes by
        skipping batches (and says so once).
        """
        loader = self.dataloader
        if isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset):
            self._loader, self._resumable = _resumable_loader(loader, seed)

    def iter_epoch(self, epoch: int, batches_done: int = 0) -> Iterator[Batch]:
        """Iterate epoch ``epoch`` starting after its first ``batches_done`` batches."""
        self._length = _UNKNOWN  # the data may have changed between epochs
        if self._resumable is not None:
            self._resumable.set_position(epoch, batches_done)
            return iter(self._loader)
        sampler = getattr(self._loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        iterator = iter(self._loader)
        if batches_done and not hasattr(self._loader, "state_dict"):
            if not self._warned_replay:
                self._warned_replay = True
                warnings.warn(
                    f"resuming mid-epoch on a {type(self._loader).__name__}, which trainkit "
                    f"cannot position directly: skipping {batches_done} batches by iterating "
                    "them. Use a map-style DataLoader, or a loader with state_dict(), to resume "
                    "without reading the skipped data",
                    stacklevel=2,
                )
            iterator = itertools.islice(iterator, batches_done, None)
        return iterator

    def state_dict(self) -> dict[str, Any]:
        """The loader's own state when it has one (e.g. torchdata's StatefulDataLoader)."""
        state_dict = getattr(self._loader, "state_dict", None)
        return {"loader": state_dict()} if state_dict is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "loader" in state and hasattr(self._loader, "load_state_dict"):
            self._loader.load_state_dict(state["loader"])
