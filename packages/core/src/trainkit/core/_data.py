"""`DataSpec`: how the loop counts, splits and moves batches, and resumes mid-epoch."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from trainkit.core import dist
from trainkit.core._data_position import (
    DataPosition,
    LoaderState,
    ReplayPosition,
    SamplerPosition,
    StatefulLoader,
)
from trainkit.core._streaming import StreamingPosition

__all__ = [
    "DataSpec",
    "default_num_samples",
    "default_num_tokens",
    "default_split_batch",
    "to_device",
]

Batch = Any
_UNKNOWN = object()


def to_device(batch: Batch, device: torch.device) -> Batch:
    """Move every tensor in a (nested) tuple / list / dict batch to ``device``.

    Containers are rebuilt, so that changing the result in place leaves ``batch`` as it
    was; a tuple whose values are all tensors on ``device`` already is returned as it is
    (nothing in it can change).
    """
    # Concrete types first: isinstance against the Mapping ABC is slow, and this runs per step.
    kind = batch.__class__
    if kind is tuple or kind is list:  # the common (inputs, targets) batch
        for value in batch:
            if value.__class__ is not torch.Tensor or value.device != device:
                return kind([to_device(v, device) for v in batch])
        # Every tensor is there already (CPU training): no call per value, no new tuple.
        return batch if kind is tuple else batch.copy()
    if isinstance(batch, torch.Tensor):
        # Already there (CPU training): comparing devices costs a fraction of a no-op .to().
        return batch if batch.device == device else batch.to(device, non_blocking=True)
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
    # The first tensor with a batch dimension (a 0-d tensor is a setting, not samples).
    if isinstance(batch, torch.Tensor):
        return batch if batch.ndim else None
    first = batch[0] if type(batch) in (tuple, list) and batch else None
    if isinstance(first, torch.Tensor) and first.ndim:
        return first  # the common (inputs, targets) batch, without the general walk
    values = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(values, Iterable) and not isinstance(values, str | bytes):
        for value in values:
            if (found := _first_tensor(value)) is not None:
                return found
    return None


def default_num_samples(batch: Batch) -> int:
    """Samples in a batch: the size of dim 0 of its first tensor, or for packed text (a
    dict batch with ``position_ids`` beside ``input_ids``, as HF's flattening collator
    makes) the number of sequences, each starting at position 0."""
    kind = batch.__class__
    if kind is tuple or kind is list:  # the common (inputs, targets) batch: no walk, no ABC check
        first = batch[0] if batch else None
        if first.__class__ is torch.Tensor and (shape := first.shape):
            return shape[0]
    elif isinstance(batch, Mapping) and isinstance(batch.get("position_ids"), torch.Tensor):
        positions, ids = batch["position_ids"], batch.get("input_ids")
        if isinstance(ids, torch.Tensor) and positions.shape == ids.shape:
            return int((positions == 0).sum())
    tensor = _first_tensor(batch)
    if tensor is None or tensor.ndim == 0:
        raise ValueError(
            f"cannot tell how many samples a batch of type {type(batch).__name__} holds; "
            "pass DataSpec(get_num_samples_in_batch=...)"
        )
    return tensor.shape[0]


def default_num_tokens(batch: Batch) -> int:
    """Tokens in a dict batch with ``input_ids``: those the attention mask keeps when there
    is one, else all of them (packed text has no padding); 0 for other batches."""
    kind = batch.__class__
    if kind is tuple or kind is list or isinstance(batch, torch.Tensor):
        return 0
    if isinstance(batch, Mapping) and isinstance(batch.get("input_ids"), torch.Tensor):
        mask = batch.get("attention_mask")
        return int(mask.sum()) if isinstance(mask, torch.Tensor) else batch["input_ids"].numel()
    return 0


def default_split_batch(batch: Batch, microbatch_size: int) -> list[Batch]:
    """Split along dim 0 into chunks of ``microbatch_size`` (the last may be smaller).

    Tensors are split along dim 0; mappings, tuples and lists holding tensors element by
    element. A list or tuple with no tensor in it (one plain value per sample: ids, texts)
    is split along its length, and a plain value beside the tensors (a string, number,
    bool, None or 0-d tensor: a setting for the whole batch), or a mapping of only such
    values (``generation_kwargs``), goes to every microbatch, as Composer does for plain
    values.
    """
    if isinstance(batch, torch.Tensor):
        return list(batch.split(microbatch_size))
    if isinstance(batch, list | tuple) and _first_tensor(batch) is None:
        return [batch[i : i + microbatch_size] for i in range(0, len(batch), microbatch_size)]
    if isinstance(batch, Mapping):
        parts = {
            k: default_split_batch(v, microbatch_size)
            for k, v in batch.items()
            if not _same_in_every_microbatch(v)
        }
        count = _common_count(parts.values(), batch)
        return [
            type(batch)({k: parts[k][i] if k in parts else v for k, v in batch.items()})
            for i in range(count)
        ]
    if isinstance(batch, list | tuple):
        split = [
            None if _same_in_every_microbatch(v) else default_split_batch(v, microbatch_size)
            for v in batch
        ]
        count = _common_count([p for p in split if p is not None], batch)
        build = (lambda xs: type(batch)(*xs)) if hasattr(batch, "_fields") else type(batch)
        return [
            build([v if p is None else p[i] for v, p in zip(batch, split, strict=True)])
            for i in range(count)
        ]
    raise TypeError(
        f"cannot split a batch element of type {type(batch).__name__} into microbatches; "
        "pass DataSpec(split_batch=...) or use tensors, plain values, and tuples, lists or "
        "dicts of them"
    )


_PLAIN = (str, bytes, int, float, bool, type(None))


def _same_in_every_microbatch(value: Any) -> bool:
    # A plain value, a 0-d tensor, or a mapping of only these (generation_kwargs): a
    # setting for the whole batch.
    if isinstance(value, Mapping):
        return all(_same_in_every_microbatch(v) for v in value.values())
    return isinstance(value, _PLAIN) or (isinstance(value, torch.Tensor) and value.ndim == 0)


def _common_count(parts: Iterable[Sequence[Any]], batch: Batch) -> int:
    counts = {len(p) for p in parts}
    if not counts:
        raise TypeError(
            f"cannot split a {type(batch).__name__} batch of plain values only into "
            "microbatches: it holds no tensor and no per-sample list; pass "
            "DataSpec(split_batch=...)"
        )
    if len(counts) != 1:
        raise ValueError(
            f"batch elements have different sizes along dim 0 ({sorted(counts)} microbatches); "
            f"cannot split {type(batch).__name__} evenly"
        )
    return counts.pop()


class DataSpec:
    """Wraps any iterable of batches and says how to handle its batches.

    Args:
        dataloader: a `DataLoader` or any re-iterable of batches.
        num_samples: samples per epoch, if known (defaults to ``len(dataset)``).
        get_num_samples_in_batch: batch -> samples (default: `default_num_samples`).
        get_num_tokens_in_batch: batch -> tokens (default: `default_num_tokens`).
        split_batch: ``(batch, microbatch_size) -> list`` (default: split along dim 0).
        device_transfer: ``(batch, device) -> batch`` (default: move every tensor).
        batch_transforms: ``batch -> batch``, applied to each batch as the loader yields it,
            before it is counted and moved to the device (CPU-side normalisation, ...), in
            training, evaluation and prediction (as Composer's).
        microbatch_transforms: ``batch -> batch``, applied to each microbatch (the whole
            batch when it is not split) on the device, just before its forward (GPU-side
            normalisation, ...), as Composer's. Return a new batch rather than changing
            the given one in place: a batch retried after out-of-memory is transformed
            again.
        position: how the loader is positioned on resume and what checkpoints hold of it, a
            `DataPosition`. Default: chosen for the loader when the run starts (a map-style
            `DataLoader`'s sampler, a `StreamingDataset`'s sample position, the loader's own
            ``state_dict()``, or else replaying the trained batches).
        sum_counts: how a step's samples and tokens are counted over data-parallel ranks.
            True: every rank's counts are summed (one small collective per step; exact when
            ranks' batches differ, e.g. padded or packed text of varying length). False:
            this rank's counts times the number of data-parallel ranks (no communication;
            exact when every rank's batch holds as many). None: True when the batches hold
            tokens or the counting functions are given, else False (decided at the first
            batch, the same on every rank).
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
        batch_transforms: Callable[[Batch], Batch] | None = None,
        microbatch_transforms: Callable[[Batch], Batch] | None = None,
        position: DataPosition | None = None,
        sum_counts: bool | None = None,
    ):
        if not isinstance(dataloader, Iterable):
            raise TypeError(f"dataloader must be iterable, got {type(dataloader).__name__}")
        if position is not None and not isinstance(position, DataPosition):
            raise TypeError(
                f"position must be a DataPosition (trainkit.core.data), got {type(position).__name__}"
            )
        self.dataloader = dataloader
        self.num_samples = num_samples
        if num_samples is None and isinstance(dataloader, DataLoader):
            dataset = dataloader.dataset
            if not isinstance(dataset, IterableDataset) and hasattr(dataset, "__len__"):
                self.num_samples = len(dataset)  # type: ignore[arg-type]
        custom_counts = get_num_samples_in_batch is not None or get_num_tokens_in_batch is not None
        self.get_num_samples_in_batch = get_num_samples_in_batch or default_num_samples
        self.get_num_tokens_in_batch = get_num_tokens_in_batch or default_num_tokens
        self.split_batch = split_batch or default_split_batch
        self.device_transfer = device_transfer or to_device
        for name, transform in (
            ("batch_transforms", batch_transforms),
            ("microbatch_transforms", microbatch_transforms),
        ):
            if transform is not None and not callable(transform):
                raise TypeError(
                    f"{name} must be a function batch -> batch, got {type(transform).__name__}"
                )
        self.batch_transforms = batch_transforms
        """Applied to each batch as the loader yields it (None: none)."""
        self.microbatch_transforms = microbatch_transforms
        """Applied to each microbatch on the device before its forward (None: none)."""
        self.sum_counts = sum_counts
        self._world: int | None = None  # read by iter_epoch: groups do not change mid-epoch
        self._custom_counts = custom_counts
        self._chosen_position = position
        self.position: DataPosition = ReplayPosition()
        """How the loader resumes; `make_resumable` chooses it for the training data."""
        self._resumable = False
        self._pending: dict[str, Any] | None = None
        self._loader: Iterable[Batch] = dataloader
        self._live: tuple[int, list[int], Iterator[Batch]] | None = None
        self._length: int | object | None = _UNKNOWN

    @classmethod
    def coerce(cls, data: Any, what: str) -> DataSpec:
        """``data`` as a `DataSpec`: itself, or a `DataLoader` / re-iterable of batches
        wrapped in one; ``what`` names it in errors (an empty or non-iterable ``data``)."""
        if isinstance(data, DataSpec):
            spec = data
        elif isinstance(data, Iterable):
            spec = cls(data)
        else:
            raise TypeError(
                f"{what} must be a DataLoader, an iterable of batches or a DataSpec, got "
                f"{type(data).__name__}"
            )
        if spec.length == 0:
            raise ValueError(f"{what} is empty (len() == 0); give it at least one batch")
        return spec

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
        """Choose the loader's `DataPosition` (``position`` if given) and prepare it, so a
        run can resume at any batch. Called once, for the training data."""
        if self._resumable:
            return
        self.position = self._chosen_position or position_for(self.dataloader)
        self._loader = self.position.prepare(self.dataloader, seed)
        self._resumable = True
        if self._pending is not None:
            self.position.load_state_dict(self._pending)
            self._pending = None

    def iter_epoch(self, epoch: int, batches_done: int = 0) -> Iterator[Batch]:
        """Iterate epoch ``epoch`` starting after its first ``batches_done`` batches."""
        self._length = _UNKNOWN  # the data may have changed between epochs
        self._world = dist.get_world_size()
        if self._live is not None:
            live_epoch, yielded, iterator = self._live
            if batches_done and (live_epoch, yielded[0]) == (epoch, batches_done):
                return iterator  # the same process goes on where it stopped: nothing to skip
        yielded = [batches_done]
        iterator = _counting(self.position.iter_epoch(self._loader, epoch, batches_done), yielded)
        self._live = (epoch, yielded, iterator)
        return iterator

    def count_batch(
        self, batch: Batch, data_parallel_size: int, device: torch.device | str = "cpu"
    ) -> tuple[int, int]:
        """Samples and tokens that this step trains on over all data-parallel ranks.

        Collective when counts are summed (see ``sum_counts``): every rank calls it once
        per batch. ``device`` must suit the process group (a CUDA device under NCCL).
        """
        samples = self.get_num_samples_in_batch(batch)
        tokens = self.get_num_tokens_in_batch(batch)
        world = self._world or dist.get_world_size()
        if world == 1:
            return samples * data_parallel_size, tokens * data_parallel_size
        if self.sum_counts is None:
            self.sum_counts = dist.any_rank(self._custom_counts or tokens > 0, device)
        if not self.sum_counts:
            return samples * data_parallel_size, tokens * data_parallel_size
        totals = torch.tensor([samples, tokens], dtype=torch.int64, device=device)
        summed = dist.all_reduce(totals).tolist()
        sharing = world // data_parallel_size  # ranks that read one batch (tensor parallel)
        return summed[0] // sharing, summed[1] // sharing

    def state_dict(self) -> dict[str, Any]:
        """Where every rank's data is, for a checkpoint. Collective: every rank calls it.

        ``{"ranks": [...]}``, each rank's `DataPosition.state_dict` in rank order,
        serialised to bytes: a checkpoint writer that keeps one copy of a non-tensor value
        (torch.distributed.checkpoint keeps rank 0's) still holds every rank's.
        """
        return {"ranks": dist.all_gather_object(_encode(self.position.state_dict()))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore this rank's position from what `state_dict` returned (on every rank).

        Raises:
            ValueError: the positions were saved by another number of ranks and the
                position is not elastic, or an elastic position differs between ranks.
        """
        if "ranks" not in state:
            return
        self._live = None  # a loaded position replaces wherever this process was
        saved = [_decode(blob) for blob in state["ranks"]]
        world, rank = dist.get_world_size(), dist.get_rank()
        if len(saved) == world:
            mine = saved[rank]
        elif not self.position.elastic:
            raise ValueError(
                f"the checkpoint's data position was saved by {len(saved)} ranks and this run "
                f"has {world}: a {type(self.position).__name__} keeps one position per rank, "
                f"which cannot be moved to another number of ranks. Resume on {len(saved)} "
                "ranks, use data whose position is global (a StreamingDataset), or leave the "
                "data position out (load_ignore_keys=['data']: the epoch is then replayed)"
            )
        elif any(not _same(s, saved[0]) for s in saved[1:]):
            raise ValueError(
                f"the checkpoint's {type(self.position).__name__} positions differ between "
                f"its {len(saved)} ranks, so none of them can be given to this run's {world} "
                "ranks; resume on as many ranks as saved it"
            )
        else:
            mine = saved[0]
        if self._resumable:
            self.position.load_state_dict(mine)
        else:
            self._pending = mine  # applied once make_resumable has chosen the position


def _counting(iterator: Iterator[Batch], yielded: list[int]) -> Iterator[Batch]:
    for batch in iterator:
        yielded[0] += 1
        yield batch


def _encode(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _decode(blob: bytes) -> dict[str, Any]:
    # weights_only: a checkpoint's data state is plain data and tensors; nothing in it runs.
    return torch.load(io.BytesIO(blob), weights_only=True)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def position_for(loader: Iterable[Batch]) -> DataPosition:
    """The position that fits ``loader`` (`trainkit.core._data_position`'s docstring says how
    it is chosen)."""
    if _holds_streaming_dataset(loader):
        return StreamingPosition()
    if isinstance(loader, StatefulLoader):
        return LoaderState()
    if isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset):
        return SamplerPosition()
    return ReplayPosition()


def _holds_streaming_dataset(loader: Any) -> bool:
    # No import: a StreamingDataset exists only if its module was imported already.
    streaming = sys.modules.get("streaming")
    dataset_class = getattr(streaming, "StreamingDataset", None)
    return (
        dataset_class is not None
        and isinstance(loader, DataLoader)
        and isinstance(loader.dataset, dataset_class)
    )
