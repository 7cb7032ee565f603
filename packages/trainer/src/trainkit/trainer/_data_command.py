"""``trainkit data convert``: MDS shards for MosaicML Streaming from a data factory or a folder.

Registered as the ``data`` entry point of ``trainkit.commands`` (and `streaming_data` as the
``streaming`` entry point of ``trainkit.data``). The embedded default moves to streaming in
two steps::

    trainkit data convert stdlib_text stdlib-mds       # writes stdlib-mds/train, stdlib-mds/eval
    trainkit train --set data="{name: streaming, local: stdlib-mds}"

(or the config line ``data: {name: streaming, local: stdlib-mds}``). Shards may live in
object storage: ``trainkit data convert stdlib_text s3://bucket/stdlib`` and
``data: {name: streaming, remote: s3://bucket/stdlib, local: /tmp/stdlib-cache}``; an
S3-compatible endpoint is given to streaming by its ``S3_ENDPOINT_URL`` variable.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainkit.core import plugins
from trainkit.trainer.streaming import write_mds

__all__ = ["convert", "main"]

DATA_GROUP = "trainkit.data"


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
        '(needs pip install "trainkit-trainer[streaming]").',
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
        help="an option of the data factory, e.g. --set seq_len=256 (values are JSON; "
        "anything else is a string)",
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


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def main(argv: Sequence[str] | None = None) -> int:
    """The command; returns the exit status (0: done, 2: bad usage or input)."""
    args = _parser().parse_args(argv)
    try:
        written = convert(
            args.source,
            args.out,
            options=_pairs(args.set, "--set", _json_or_text),
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
