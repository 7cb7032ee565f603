"""YAML as configs are read: PyYAML's safe loader, with floats written the way people do.

PyYAML follows YAML 1.1, where ``1e-3`` (no dot) is a string, so ``lr: 3e-4`` in a config
or ``--set optimizers.lr=3e-4`` reached the optimizer as ``"3e-4"``. YAML 1.2 (and
every other config tool a user has met) reads it as a number; so does trainkit.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

__all__ = ["load"]


class _Loader(yaml.SafeLoader):
    """The safe loader (no Python objects), plus exponent floats without a dot."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load(text: str) -> Any:
    """``text`` parsed as YAML by the safe loader, reading ``3e-4`` as a float."""
    return yaml.load(text, Loader=_Loader)
