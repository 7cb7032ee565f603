"""Checkpoint and folder names from templates: ``{run_name}``, ``{rank}``, the `Timestamp`'s fields.

A trainkit checkpoint is one folder holding every rank's shards, so its name must be the
same on every rank. Rank fields are therefore always rank 0's (0), and the name is
formatted on rank 0 and sent to the others (wall-clock times differ between ranks).
"""

from __future__ import annotations

import string
from typing import Any

from trainkit.core import Timestamp

__all__ = [
    "FOLDER_FIELDS",
    "NAME_FIELDS",
    "check_folder_template",
    "check_name_format",
    "fill_folder",
    "format_name",
    "has_fields",
]

TIME_FIELDS = Timestamp._fields
_RANK_FIELDS = ("rank", "local_rank", "node_rank")
FOLDER_FIELDS = ("run_name", *_RANK_FIELDS, "world_size")
NAME_FIELDS = (*FOLDER_FIELDS, *TIME_FIELDS)
_LATEST = "latest"  # the pointer file beside the checkpoint folders (_commit.LATEST)
# What Composer writes as tarballs or compressed files: trainkit writes folders, uncompressed.
_ARCHIVE_SUFFIXES = (
    ".tar", ".tgz", ".tar.gz", ".tar.bz2", ".tar.lzma",
    ".pt.bz2", ".pt.gz", ".pt.lz4", ".pt.lzma", ".pt.lzo", ".pt.xz", ".pt.zst",
)  # fmt: skip


def has_fields(template: str) -> bool:
    """Whether ``template`` has any ``{field}`` to fill (or a stray brace to complain about)."""
    try:
        return any(name is not None for _, name, _, _ in string.Formatter().parse(template))
    except ValueError:
        return True


def _fields(template: str, what: str, accepted: tuple[str, ...]) -> None:
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as err:  # an unmatched brace
        raise ValueError(f"{what} {template!r} is not a valid template ({err})") from None
    for name in names:
        if name.split(".")[0].split("[")[0] not in accepted:
            shown = ", ".join("{" + f + "}" for f in accepted)
            raise ValueError(
                f"{what} {template!r} is not valid: it has the field {{{name}}}, which it "
                f"cannot fill; it accepts {shown} (double a brace, '{{{{', for a literal one)"
            )


def _values(timestamp: Timestamp, run_name: str, world_size: int) -> dict[str, Any]:
    # Rank fields are rank 0's: the checkpoint folder holds every rank's shards, and its
    # name must never differ between ranks.
    rank_values = dict.fromkeys(_RANK_FIELDS, 0)
    return {
        **timestamp.state_dict(),
        "run_name": run_name,
        **rank_values,
        "world_size": world_size,
    }


def check_name_format(template: str) -> None:
    """Raise `ValueError` unless ``template`` makes a plain folder name."""
    if not isinstance(template, str):
        raise TypeError(f"name_format must be a string, got {type(template).__name__}")
    _fields(template, "name_format", NAME_FIELDS)
    lowered = template.lower()
    for suffix in _ARCHIVE_SUFFIXES:
        if lowered.endswith(suffix):
            raise ValueError(
                f"name_format {template!r} ends in {suffix!r}: trainkit writes each checkpoint "
                "as a folder of uncompressed shards, never an archive; drop the suffix"
            )
    try:
        format_name(template, timestamp=Timestamp(), run_name="run", world_size=1)
    except (KeyError, IndexError, ValueError, TypeError) as err:
        raise ValueError(
            f"name_format {template!r} is not valid ({err}); use fields like "
            "'{epoch}', '{batch}', e.g. 'ep{epoch}-ba{batch}'"
        ) from None


def format_name(template: str, *, timestamp: Timestamp, run_name: str, world_size: int) -> str:
    """The checkpoint folder name ``template`` gives at ``timestamp`` (call it on rank 0)."""
    name = template.format(**_values(timestamp, run_name, world_size))
    if name.lower().endswith(".pt"):
        name = name[: -len(".pt")]
    if not name or "/" in name or "\\" in name or name.startswith(".") or name == _LATEST:
        raise ValueError(
            f"name_format {template!r} gives {name!r} (run_name {run_name!r}), which cannot be "
            f"the name of a checkpoint folder: it must be non-empty, hold no '/' or '\\', not "
            f"start with '.', and not be {_LATEST!r}"
        )
    return name


def check_folder_template(folder: str) -> None:
    """Raise `ValueError` unless the fields in ``folder`` are ones it can fill."""
    if has_fields(folder):
        _fields(folder, "folder", FOLDER_FIELDS)
        try:
            fill_folder(folder, run_name="run", world_size=1)
        except (KeyError, IndexError, ValueError, TypeError) as err:
            raise ValueError(f"folder {folder!r} is not a valid template ({err})") from None


def fill_folder(folder: str, *, run_name: str, world_size: int) -> str:
    """``folder`` with ``{run_name}``, ``{rank}`` (0), ``{world_size}``, ... filled in."""
    if not has_fields(folder):
        return folder
    values = _values(Timestamp(), run_name, world_size)
    return folder.format(**{name: values[name] for name in FOLDER_FIELDS})
