"""The ``trainkit`` command: built-in subcommands plus those other packages contribute."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from trainkit.core import plugins

__all__ = ["main"]


def _parser(contributed: list[str]) -> argparse.ArgumentParser:
    from trainkit.cli import _launch, _memory, _train

    parser = argparse.ArgumentParser(
        prog="trainkit",
        description="Train PyTorch models with trainkit.",
        epilog=("commands from installed packages: " + ", ".join(contributed))
        if contributed
        else None,
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _train.add_parser(subparsers)
    _launch.add_parser(subparsers)
    _memory.add_parser(subparsers)
    plugins_parser = subparsers.add_parser(
        "plugins", help="list installed trainkit entry points by group"
    )
    plugins_parser.set_defaults(handler=_list_plugins)
    for name in contributed:
        subparsers.add_parser(
            name, help=f"(from an installed package; see trainkit {name} --help)", add_help=False
        )
    return parser


def _list_plugins(args: argparse.Namespace) -> int:
    for group in plugins.GROUPS:
        entries = plugins.describe(group)
        print(f"{group} ({len(entries)})")
        for entry in entries:
            print(f"  {entry.name:<22} {entry.value:<48} [{entry.distribution}]")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trainkit`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    builtin = {"train", "launch", "plan", "plugins"}
    contributed = [n for n in plugins.available("trainkit.commands") if n not in builtin]
    if argv and argv[0] in contributed:
        return int(plugins.load("trainkit.commands", argv[0])(argv[1:]) or 0)
    args = _parser(contributed).parse_args(argv)
    if getattr(args, "handler", None) is None:
        _parser(contributed).print_help()
        return 2
    try:
        return args.handler(args)
    except ValueError as err:  # user mistakes: config, names, arguments
        print(f"trainkit {args.command}: {err}", file=sys.stderr)
        return 2
