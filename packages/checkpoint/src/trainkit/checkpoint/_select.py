"""What a load takes from a checkpoint: ``ignore_keys``, ``exclude_algorithms``, and the
algorithms a checkpoint needs (``required_on_load``)."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeAlias

from trainkit.checkpoint._errors import MissingAlgorithmError
from trainkit.core import State
from trainkit.core.messages import warn

__all__ = [
    "IgnoreKeys",
    "check_ignore_keys",
    "check_names",
    "check_required_algorithms",
    "drop_excluded_algorithms",
    "drop_matching",
]

IgnoreKeys: TypeAlias = Sequence[str] | Callable[[dict[str, Any]], None]
"""Glob patterns of entries not to load, or a callable that edits the loaded state in place."""


def check_ignore_keys(value: Any) -> list[str] | Callable[[dict[str, Any]], None]:
    """``value`` as a list of patterns, or the callable itself; `TypeError` for anything else."""
    if callable(value):
        return value
    return check_names(value, "ignore_keys", "patterns")


def check_names(value: Any, what: str, kind: str) -> list[str]:
    """``value`` as a list of strings; `TypeError` naming ``what`` otherwise."""
    if isinstance(value, str):
        raise TypeError(f"{what} must be a list of {kind}, got the string {value!r}")
    try:
        items = list(value)
    except TypeError:
        raise TypeError(
            f"{what} must be a list of {kind}, got {type(value).__name__} {value!r}"
        ) from None
    if not all(isinstance(item, str) for item in items):
        raise TypeError(f"{what} must be a list of {kind} (strings), got {items!r}")
    return items


def drop_matching(tree: dict[str, Any], patterns: Sequence[str], *, into_lists: bool) -> list[str]:
    """Delete the entries of ``tree`` whose ``/``-joined path matches a pattern; their paths.

    A path matches with or without a leading ``state/`` (``"model/head.*"`` and
    ``"state/model/head.*"`` are the same), so trainkit's and Composer's spellings both work.
    With ``into_lists``, list items are entries too (``"rng/1"``), as in Composer.
    """
    dropped: list[str] = []
    if not patterns:
        return dropped

    def matches(path: str, pattern: str) -> bool:
        other = path.removeprefix("state/") if path.startswith("state/") else f"state/{path}"
        return fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(other, pattern)

    def walk(node: Any, prefix: str) -> None:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        for key in reversed(keys) if isinstance(node, list) else keys:
            path = f"{prefix}{key}"
            if any(matches(path, p) for p in patterns):
                del node[key]
                dropped.append(path)
            elif isinstance(node[key], dict) or (into_lists and isinstance(node[key], list)):
                walk(node[key], f"{path}/")

    walk(tree, "")
    unused = [p for p in patterns if not any(matches(d, p) for d in dropped)]
    if unused:
        warn(f"ignore_keys patterns {unused} matched nothing in the state")
    return dropped


def _is_instance_of(key: str, name: str) -> bool:
    # State names a second instance of a class "Name.1", a third "Name.2", ...
    return key == name or re.fullmatch(rf"{re.escape(name)}\.\d+", key) is not None


def drop_excluded_algorithms(
    states: dict[str, Any], exclude: Sequence[str], known: Sequence[str]
) -> None:
    """Remove the excluded algorithms' entries from ``states`` (name -> state), in place.

    ``known`` are the algorithm names the run or the checkpoint has; an excluded name that
    is none of them is reported (a typo would otherwise exclude nothing, silently).
    """
    for key in [k for k in states if any(_is_instance_of(k, name) for name in exclude)]:
        del states[key]
    unknown = [name for name in exclude if not any(_is_instance_of(k, name) for k in known)]
    if unknown:
        warn(
            f"exclude_algorithms names {unknown}, which neither this run nor the checkpoint "
            f"has (known here: {sorted(set(known)) or 'none'}); nothing was excluded for them",
        )


def check_required_algorithms(
    required: Sequence[str],
    state: State,
    *,
    strict: bool,
    where: Path | str,
    exclude: Sequence[str] = (),
) -> None:
    """Refuse (warn with ``strict=False``) a checkpoint whose run had a structure-changing
    algorithm that this run lacks: its weights would not fit, or fit silently wrong.

    Algorithms named in ``exclude`` are not required.
    """
    present = {type(a).__qualname__ for a in state.algorithms}
    missing = [name for name in required if name not in present and name not in exclude]
    if not missing:
        return
    names = ", ".join(missing)
    example = ", ".join(f"{name}()" for name in missing)
    plural = "s" if len(missing) > 1 else ""
    them = "them" if plural else "it"
    message = (
        f"checkpoint {where} was saved by a run with the algorithm{plural} {names}, which "
        f"change{'' if plural else 's'} the model's structure (required_on_load), but this run "
        f"does not have {them}: add {them} to the run (e.g. algorithms=[{example}]) to load "
        f"this checkpoint, or exclude {them} with exclude_algorithms={missing!r}"
    )
    if strict:
        raise MissingAlgorithmError(f"{message}, or load with strict=False to try anyway")
    warn(f"{message}; loading anyway (strict=False)")
