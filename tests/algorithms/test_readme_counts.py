"""Counts the READMEs state are those of the code (issue 52, finding 10)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def registered_methods() -> list[str]:
    """The training methods trainkit-algorithms registers (its own entry points, not the
    third-party example's that an environment may also hold)."""
    pyproject = tomllib.loads((ROOT / "packages/algorithms/pyproject.toml").read_text())
    return sorted(pyproject["project"]["entry-points"]["trainkit.algorithms"])


def test_the_readme_counts_the_registered_methods():
    stated = re.findall(r"(\d+) training methods", (ROOT / "README.md").read_text())
    assert stated, "README.md no longer states a number of training methods"
    assert {int(n) for n in stated} == {len(registered_methods())}
