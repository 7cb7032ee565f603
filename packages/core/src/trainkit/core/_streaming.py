"""MosaicML Streaming: MDS shards written from a data set, read back through a
`StreamingDataset` whose position is saved and restored with the run.

Needs the ``streaming`` module (``pip install "trainkit-core[streaming]"``), imported only
by the functions that use it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data import default_collate as torch_default_collate

from trainkit.core import dist
from trainkit.core._data_position import DataPosition, EpochSeeds

__all__ = ["StreamingPosition", "collate_mds", "streaming_loader", "write_mds"]

INSTALL_HINT = 'pip install "trainkit-core[streaming]"'
_CONFIG_KEYS = ("num_canonical_nodes", "shuffle_seed", "initial_physical_nodes")


def _streaming() -> Any:
    try:
        import streaming
    except ImportError as err:
        raise ImportError(
            f"MDS shards and StreamingDataset need MosaicML Streaming: {INSTALL_HINT} "
            "(or pip install mosaicml-streaming)"
        ) from err
    return streaming


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
            warnings.warn(
                f"resuming epoch {epoch} at batch {batches_done} without a saved streaming "
                "position (the checkpoint has no data state): assuming it was saved on this "
                "number of ranks",
                stacklevel=4,
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


# --- reading ----------------------------------------------------------------------------


def collate_mds(samples: list[Mapping[str, Any]]) -> Any:
    """Batch MDS samples: integer arrays and numbers become int64 tensors (what embeddings
    and losses take, whatever width they were stored in), the rest as torch's
    ``default_collate`` makes them. Samples written from tuples (columns ``"0"``, ``"1"``,
    ...) become tuple batches again."""
    first = samples[0]
    keys = list(first)
    columns = {key: _collate_column([sample[key] for sample in samples]) for key in keys}
    if keys and sorted(keys, key=_tuple_index) == [str(i) for i in range(len(keys))]:
        return tuple(columns[str(i)] for i in range(len(keys)))
    return columns


def _tuple_index(key: str) -> int:
    return int(key) if key.isdigit() else -1


def _collate_column(values: list[Any]) -> Any:
    value = values[0]
    if isinstance(value, np.ndarray | np.generic) and np.issubdtype(value.dtype, np.integer):
        return torch.from_numpy(np.stack(values).astype(np.int64))
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.stack(values))  # a copy: MDS arrays are read-only views
    return torch_default_collate(values)


_SHM_ATTEMPTS = 5


def streaming_loader(
    remote: str | None = None,
    local: str | os.PathLike[str] | None = None,
    *,
    batch_size: int,
    split: str | None = None,
    shuffle: bool = True,
    shuffle_seed: int = 9176,
    num_workers: int = 0,
    drop_last: bool = True,
    **dataset_options: Any,
) -> DataLoader:
    """A `DataLoader` over a `StreamingDataset` of MDS shards, ready to resume exactly.

    Args:
        remote: where the shards are (``"s3://bucket/data"``, ...); None to read ``local``.
        local: the local copy or cache of the shards.
        batch_size: samples per batch on each rank (given to both the dataset and the loader,
            as streaming requires).
        split: a subfolder of ``remote`` / ``local`` (``"train"``, ``"eval"``).
        shuffle: shuffle each epoch (by ``shuffle_seed`` and the epoch).
        shuffle_seed: the order's seed: the same on every rank and in every resumed run.
        num_workers: data-loader worker processes.
        drop_last: drop each rank's last, smaller batch of an epoch.
        **dataset_options: more `StreamingDataset` arguments (``predownload``,
            ``cache_limit``, ``num_canonical_nodes``, ``replication``, ...).
    """
    streaming = _streaming()
    options = dict(
        remote=remote,
        local=None if local is None else os.fspath(local),
        split=split,
        batch_size=batch_size,
        shuffle=shuffle,
        shuffle_seed=shuffle_seed,
        **dataset_options,
    )
    for attempt in range(_SHM_ATTEMPTS):
        try:
            dataset = streaming.StreamingDataset(**options)
            break
        except FileExistsError:
            # Two processes starting at once on one machine can pick the same free
            # shared-memory prefix, and the second to create it fails; the next attempt
            # finds another. Ranks of one run wait for each other inside, so only a
            # process on its own retries (ranks would leave their barriers unmatched).
            if dist.get_world_size() > 1 or attempt == _SHM_ATTEMPTS - 1:
                raise
    return DataLoader(
        dataset,
        batch_size=batch_size,
        collate_fn=collate_mds,
        num_workers=num_workers,
        drop_last=drop_last,
        persistent_workers=num_workers > 0,
    )


# --- writing ----------------------------------------------------------------------------


def write_mds(
    source: Any,
    out: str | os.PathLike[str],
    *,
    columns: Mapping[str, str] | None = None,
    compression: str | None = None,
    size_limit: int | str = "64mb",
    overwrite: bool = False,
) -> int:
    """Write MDS shards (MosaicML Streaming's format) from a map-style data set or a folder.

    Args:
        source: a map-style data set (``len()`` and ``[i]``) whose samples are dicts, tuples
            or lists of tensors, arrays, numbers, strings, bytes or PIL images (tuple items
            become columns ``"0"``, ``"1"``, ...); or a folder, whose files (in sorted order,
            sub-folders included) become samples ``{"path": <relative path>, "data": <bytes>}``.
        out: a local folder, or a remote one (``"s3://bucket/data/train"``).
        columns: column name -> MDS encoding (``"ndarray:uint8"``, ``"int64"``, ``"str"``, ...),
            to store only those columns, in those types (values are cast). Default: every
            column, typed from the first sample.
        compression: shard compression (``"zstd"``, ``"zstd:7"``, ``"br"``, ``"gz"``), or None.
        size_limit: largest shard, before compression (bytes, or ``"64mb"``).
        overwrite: replace what a local ``out`` holds.

    Returns:
        The number of samples written.
    """
    streaming = _streaming()
    rows, encodings = _rows(source, columns)
    written = 0
    options = {"exist_ok": True} if overwrite else {}
    local = Path(out) if "://" not in os.fspath(out) else None
    if local is not None and local.is_dir() and any(local.iterdir()) and not overwrite:
        raise FileExistsError(f"{local} is not empty; pass overwrite=True to replace it")
    with streaming.MDSWriter(
        out=os.fspath(out),
        columns=encodings,
        compression=compression,
        size_limit=size_limit,
        **options,
    ) as writer:
        for row in rows:
            writer.write(row)
            written += 1
    return written


def _rows(source: Any, columns: Mapping[str, str] | None) -> tuple[Iterator[dict], dict[str, str]]:
    if isinstance(source, str | os.PathLike):
        folder = Path(source)
        if not folder.is_dir():
            raise ValueError(f"{folder} is not a folder; give a folder of files or a data set")
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        if not files:
            raise ValueError(f"{folder} holds no files to write")
        encodings = {"path": "str", "data": "bytes"}
        rows = ({"path": p.relative_to(folder).as_posix(), "data": p.read_bytes()} for p in files)
        return rows, encodings
    if isinstance(source, IterableDataset) or not (
        hasattr(source, "__len__") and hasattr(source, "__getitem__")
    ):
        raise TypeError(
            f"write_mds needs a map-style data set (len() and [i]) or a folder, got "
            f"{type(source).__name__}"
        )
    if len(source) == 0:
        raise ValueError("the data set is empty: nothing to write")
    first = _as_row(source[0])
    encodings = dict(columns) if columns else {k: _encoding(k, v) for k, v in first.items()}
    missing = sorted(set(encodings) - set(first))
    if missing:
        raise ValueError(f"columns {missing} are not in the samples, which hold {sorted(first)}")
    return (_cast(_as_row(source[i]), encodings) for i in range(len(source))), encodings


def _as_row(sample: Any) -> dict[str, Any]:
    if isinstance(sample, Mapping):
        return {str(k): _plain(v) for k, v in sample.items()}
    if isinstance(sample, tuple | list):
        return {str(i): _plain(v) for i, v in enumerate(sample)}
    return {"0": _plain(sample)}


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, list) and value and all(isinstance(v, int | float) for v in value):
        return np.asarray(value)  # e.g. token ids
    return value


def _encoding(name: str, value: Any) -> str:
    if isinstance(value, np.ndarray) and value.ndim > 0:
        return f"ndarray:{value.dtype.name}"
    if isinstance(value, np.ndarray | np.generic):
        return value.dtype.name if value.dtype.kind in "iuf" else "ndarray"
    if isinstance(value, bool | int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "str"
    if isinstance(value, bytes):
        return "bytes"
    if type(value).__module__.startswith("PIL."):
        return "pil"
    raise ValueError(
        f"column {name!r} holds a {type(value).__name__}, which has no MDS encoding here; "
        "samples may hold tensors, arrays, numbers, strings, bytes or PIL images, or pass "
        "columns={name: encoding}"
    )


def _cast(row: dict[str, Any], encodings: Mapping[str, str]) -> dict[str, Any]:
    out = {}
    for name, encoding in encodings.items():
        value = row[name]
        kind, _, rest = encoding.partition(":")
        if kind == "ndarray" and rest:
            value = np.asarray(value).astype(rest.split(":")[0], copy=False)
        elif kind in _NUMPY_SCALARS:
            value = np.asarray(value).astype(kind).reshape(()).item()
            value = np.dtype(kind).type(value)
        out[name] = value
    return out


_NUMPY_SCALARS = {
    "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
    "float16", "float32", "float64",
}  # fmt: skip
