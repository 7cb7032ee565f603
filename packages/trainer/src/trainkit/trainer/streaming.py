"""MosaicML Streaming: MDS shards written from a data set (`write_mds`), read back through a
`StreamingDataset` (`streaming_loader`) whose position trainkit-core saves and restores with
the run (`trainkit.core.data.StreamingPosition`), and the ``streaming`` data of config
files (`streaming_data`).

Needs the ``streaming`` module (``pip install "trainkit-trainer[streaming]"``), imported
only by the functions that use it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data import default_collate as torch_default_collate

from trainkit.core import dist

__all__ = ["collate_mds", "streaming_data", "streaming_loader", "write_mds"]

INSTALL_HINT = 'pip install "trainkit-trainer[streaming]"'


def _streaming() -> Any:
    try:
        import streaming
    except ImportError as err:
        raise ImportError(
            f"MDS shards and StreamingDataset need MosaicML Streaming: {INSTALL_HINT} "
            "(or pip install mosaicml-streaming)"
        ) from err
    return streaming


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


# --- config files ---------------------------------------------------------------------


def streaming_data(
    remote: str | None = None,
    local: str | None = None,
    batch_size: int = 16,
    eval_batch_size: int = 64,
    train_split: str = "train",
    eval_split: str | None = "eval",
    shuffle: bool = True,
    shuffle_seed: int = 9176,
    num_workers: int = 0,
    predownload: int | None = None,
    cache_limit: str | None = None,
) -> dict[str, Any]:
    """Train / eval loaders over MDS shards (as ``trainkit data convert`` writes them):
    ``<remote or local>/<train_split>`` and, unless ``eval_split`` is null,
    ``<...>/<eval_split>``. A resumed run continues at the sample where it stopped, on any
    number of ranks. ``local`` is the local copy, or the cache of a ``remote``."""
    if remote is None and local is None:
        raise ValueError("streaming data needs remote (e.g. s3://bucket/data), local, or both")
    options: dict[str, Any] = {"predownload": predownload, "cache_limit": cache_limit}
    loaders = {
        "train": streaming_loader(
            remote, local, split=train_split, batch_size=batch_size, shuffle=shuffle,
            shuffle_seed=shuffle_seed, num_workers=num_workers, **options,
        )
    }  # fmt: skip
    if eval_split is not None:
        loaders["eval"] = streaming_loader(
            remote, local, split=eval_split, batch_size=eval_batch_size, shuffle=False,
            num_workers=num_workers, drop_last=False, **options,
        )  # fmt: skip
    return loaders
