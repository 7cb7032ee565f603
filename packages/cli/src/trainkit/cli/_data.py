"""``trainkit data convert``, and the ``streaming`` data: MDS shards for MosaicML Streaming.

Registered as the ``data`` entry point of ``trainkit.commands`` and the ``streaming`` entry
point of ``trainkit.data``. The embedded default moves to streaming in two steps::

    trainkit data convert stdlib_text stdlib-mds       # writes stdlib-mds/train, stdlib-mds/eval
    trainkit train --set data="{name: streaming, local: stdlib-mds}"

(or the config line ``data: {name: streaming, local: stdlib-mds}``). Shards may live in
object storage: ``trainkit data convert stdlib_text s3://bucket/stdlib`` and
``data: {name: streaming, remote: s3://bucket/stdlib, local: /tmp/stdlib-cache}``; an
S3-compatible endpoint is given to streaming by its ``S3_ENDPOINT_URL`` variable.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainkit.cli._yaml import load as load_yaml
from trainkit.core import plugins

__all__ = ["convert", "main", "streaming"]

DATA_GROUP = "trainkit.data"


def streaming(
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
    from trainkit.core.data import streaming_loader

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


def convert(
    source: str,
    out: str,
    *,
    options: dict[str, Any] | None = None,
    columns: dict[str, str] | None = None,
    compression: str | None = None,
    size_limit: str = "64mb",
    overwrite: bool = False,
) -> dict[str, int]:
    """Write ``source`` as MDS shards under ``out``; returns samples written per folder.

    ``source`` is a folder of files (one sample per file, written to ``out`` itself) or the
    name of a ``trainkit.data`` factory (called with ``options``), each of whose map-style
    loaders is written to ``out/<split>`` (``train``, ``eval``).
    """
    from trainkit.core.data import write_mds

    settings = {"columns": columns, "compression": compression, "size_limit": size_limit,
                "overwrite": overwrite}  # fmt: skip
    if Path(source).is_dir():
        if options:
            raise ValueError(f"--set is for data factories; {source} is a folder")
        return {out: write_mds(source, out, **settings)}
    known = plugins.available(DATA_GROUP)
    if source not in known:
        raise ValueError(
            f"{source!r} is neither a folder nor a data factory; the data factories are "
            f"{', '.join(sorted(known))}"
        )
    loaders = plugins.load(DATA_GROUP, source)(**(options or {}))
    if not isinstance(loaders, dict) or not loaders:
        raise ValueError(
            f"data factory {source!r} returned {type(loaders).__name__}, not a dict of loaders"
        )
    written = {}
    for split, loader in loaders.items():
        dataset = getattr(loader, "dataset", None)
        if dataset is None:
            raise ValueError(
                f"{source}'s {split!r} loader has no .dataset to convert "
                f"({type(loader).__name__}); give a DataLoader over a map-style data set"
            )
        target = f"{out.rstrip('/')}/{split}"
        written[target] = write_mds(dataset, target, **settings)
    return written


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainkit data",
        description="Prepare data for trainkit: MDS shards for MosaicML Streaming "
        '(needs pip install "trainkit-cli[streaming]").',
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    convert_parser = commands.add_parser(
        "convert",
        help="write MDS shards from a data factory (e.g. stdlib_text) or a folder of files",
        description="Write MDS shards from a trainkit.data factory's map-style data sets "
        "(one folder per split: OUT/train, OUT/eval) or from a folder of files (one sample "
        "{path, data} per file). OUT is a local folder or a URL (s3://bucket/prefix; an "
        "S3-compatible endpoint is read by streaming from S3_ENDPOINT_URL).",
    )
    convert_parser.add_argument("source", help="a trainkit.data factory name, or a folder")
    convert_parser.add_argument("out", help="where to write: a folder or s3://bucket/prefix")
    convert_parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="an option of the data factory, e.g. --set seq_len=256 (values are YAML)",
    )  # fmt: skip
    convert_parser.add_argument(
        "--column", action="append", default=[], metavar="NAME=ENCODING",
        help="store only these columns, as these MDS encodings, e.g. input_ids=ndarray:uint8",
    )  # fmt: skip
    convert_parser.add_argument("--compression", help="zstd, zstd:7, br, gz, ... (default: none)")
    convert_parser.add_argument("--size-limit", default="64mb", help="largest shard (64mb)")
    convert_parser.add_argument("--overwrite", action="store_true", help="replace local output")
    return parser


def _pairs(items: Sequence[str], flag: str, parse: Any) -> dict[str, Any]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} {item!r} is not KEY=VALUE")
        pairs[key] = parse(value)
    return pairs


def main(argv: Sequence[str] | None = None) -> int:
    """The command; returns the exit status (0: done, 2: bad usage or input)."""
    args = _parser().parse_args(argv)
    try:
        written = convert(
            args.source,
            args.out,
            options=_pairs(args.set, "--set", load_yaml),
            columns=_pairs(args.column, "--column", str) or None,
            compression=args.compression,
            size_limit=args.size_limit,
            overwrite=args.overwrite,
        )
    except (ValueError, TypeError, FileExistsError, ImportError) as err:
        print(f"trainkit data {args.command}: {err}", file=sys.stderr)
        return 2
    for target, count in written.items():
        print(f"wrote {count} samples to {target}", flush=True)
    return 0
