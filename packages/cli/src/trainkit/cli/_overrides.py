"""``--set key=value``: overrides applied to a config before it is validated."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from trainkit.cli._schema import ConfigError
from trainkit.cli._yaml import load as load_yaml

__all__ = ["apply_overrides"]


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``["trainer.max_duration=2ep", "algorithms.0.alpha=0.2"]`` applied to a copy of ``raw``."""
    result = copy.deepcopy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(
                f"--set {item!r} is not key=value; e.g. --set trainer.max_duration=2ep"
            )
        parts = key.split(".")
        node: Any = result
        for depth, part in enumerate(parts[:-1]):
            child = _child(node, part, item)
            if child is None:
                child = {}
            elif isinstance(child, str) and depth == 0:
                child = {"name": child}  # a component given by name only
            if not isinstance(child, dict | list):
                raise ConfigError(
                    f"--set {item!r}: {'.'.join(parts[: depth + 1])} is not a section"
                )
            _assign(node, part, child, item)
            node = child
        _assign(node, parts[-1], load_yaml(text) if text else "", item)
    return result


def _child(node: Any, part: str, item: str) -> Any:
    if isinstance(node, list):
        return node[_index(node, part, item)]
    return node.get(part)


def _assign(node: Any, part: str, value: Any, item: str) -> None:
    if isinstance(node, list):
        node[_index(node, part, item)] = value
    else:
        node[part] = value


def _index(node: list[Any], part: str, item: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError(
            f"--set {item!r}: {part!r} is not an index of a list of {len(node)} (0..{len(node) - 1})"
        )
    return int(part)
