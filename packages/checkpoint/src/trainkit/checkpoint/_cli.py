"""``trainkit checkpoint inspect|verify|export``: the checkpoint tools on the command line.

Registered as the ``checkpoint`` entry point of ``trainkit.commands``; also runs on its own::

    python -m trainkit.checkpoint inspect runs/my-run/latest
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence
from typing import Any

from trainkit.checkpoint._errors import CheckpointError
from trainkit.checkpoint._export import FORMATS, export_checkpoint
from trainkit.checkpoint._tools import inspect_checkpoint, verify_checkpoint

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-o",
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of a remote storage, e.g. endpoint_url=http://127.0.0.1:9000 (repeatable)",
    )
    parser = argparse.ArgumentParser(
        prog="trainkit checkpoint",
        description="Look into, check and export trainkit checkpoints (local paths or URLs "
        "such as s3://bucket/prefix/latest). Nothing in a checkpoint is ever executed.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    inspect = commands.add_parser(
        "inspect", parents=[common], help="what a checkpoint holds: time, layout, files, keys"
    )
    inspect.add_argument("path", help="a checkpoint folder, a latest file, or a folder with one")
    inspect.add_argument("--json", action="store_true", help="print JSON instead of text")
    verify = commands.add_parser(
        "verify", parents=[common], help="check every file against the manifest's size and checksum"
    )
    verify.add_argument("path", help="a checkpoint folder, a latest file, or a folder with one")
    export = commands.add_parser(
        "export",
        parents=[common],
        help="the model for inference: safetensors weights, a torch.export program, ONNX, "
        "or a HuggingFace folder",
    )
    export.add_argument("path", help="a checkpoint folder, a latest file, or a folder with one")
    export.add_argument("out", nargs="?", help="where to write (or --out)")
    export.add_argument("--out", dest="out_option", metavar="OUT", help="where to write")
    export.add_argument(
        "--format",
        choices=FORMATS,
        default="safetensors",
        help="safetensors (default): the full weights as one file; torch-export: a .pt2 "
        "program; onnx: an .onnx file; hf: a folder from_pretrained loads. All but "
        "safetensors need a checkpoint of a HuggingFaceModel (its config travels with it)",
    )
    export.add_argument(
        "--seq-len", type=int, default=8, help="tokens per example input (torch-export, onnx)"
    )
    export.add_argument(
        "--batch-size", type=int, default=2, help="rows of the example input (torch-export, onnx)"
    )
    export.add_argument(
        "--merge-adapter",
        action="store_true",
        help="merge a peft adapter into the base weights first (merge_and_unload)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command; returns the exit status (0: done, 1: a bad checkpoint, 2: bad usage)."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, or a usage error argparse has already printed
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        options = _storage_options(args.storage_option)
        if args.command == "inspect":
            info = inspect_checkpoint(args.path, storage_options=options)
            print(json.dumps(info, indent=2) if args.json else _describe(info))
        elif args.command == "verify":
            manifest = verify_checkpoint(args.path, storage_options=options)
            print(
                f"ok: {args.path}: {len(manifest.files)} files match their sizes and checksums "
                "in the manifest"
            )
        else:
            out = _export_out(args)
            shapes = export_checkpoint(
                args.path,
                out,
                format=args.format,
                seq_len=args.seq_len,
                batch_size=args.batch_size,
                merge_adapter=args.merge_adapter,
                storage_options=options,
            )
            print(f"wrote {out}: {len(shapes)} tensors ({args.format})")
    except (CheckpointError, ValueError, OSError, ImportError) as err:
        print(f"trainkit checkpoint {args.command}: {err}", file=sys.stderr)
        return 1
    return 0


def _export_out(args: argparse.Namespace) -> str:
    if (args.out is None) == (args.out_option is None):
        raise ValueError(
            "export needs where to write: give OUT or --out OUT (one of them, not both)"
        )
    return args.out if args.out is not None else args.out_option


def _storage_options(pairs: list[str]) -> dict[str, Any] | None:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"storage option {pair!r} is not KEY=VALUE")
        try:
            options[key] = json.loads(value)  # numbers and booleans as such
        except ValueError:
            options[key] = value
    return options or None


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _required(algorithms: list[str]) -> str:
    if not algorithms:
        return "no algorithms"
    return f"{', '.join(algorithms)} (algorithms a run must have to load it)"


def _describe(info: dict[str, Any]) -> str:
    t = info["timestamp"]
    created = datetime.datetime.fromtimestamp(info["created"], datetime.UTC)
    layout = ", ".join(f"{k}={v}" for k, v in info["layout"].items()) or "-"
    lines = [
        f"checkpoint   {info['path']}",
        f"saved        {created:%Y-%m-%d %H:%M:%S} UTC, trainkit {info['trainkit_version']}, "
        f"torch {info['torch_version']}",
        f"timestamp    epoch {t.get('epoch')}, batch {t.get('batch')}, "
        f"sample {t.get('sample')}, token {t.get('token')}",
        f"world size   {info['world_size']} ({layout})",
        f"run name     {info['run_name'] or '-'}",
        f"contents     {'model weights only' if info['weights_only'] else 'full training state'}",
        f"requires     {_required(info['required_algorithms'])}",
        f"files        {len(info['files'])} files, {_size(info['total_size'])}",
    ]
    width = max(map(len, info["files"]), default=0)
    lines += [f"  {name:<{width}}  {_size(size):>10}" for name, size in info["files"].items()]
    lines.append(f"keys         {', '.join(info['keys'])}")
    model = info["model"]
    lines.append(f"model        {len(model)} tensors, {info['model_numel']:,} parameters")
    width = max(map(len, model), default=0)
    lines += [
        f"  {name:<{width}}  {tuple(entry['shape'])!s:<14} {entry['dtype']}"
        for name, entry in model.items()
    ]
    return "\n".join(lines)
