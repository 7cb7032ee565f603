"""The fenced code blocks of the READMEs and docs/, and what a block's marker says.

A block is marked by an HTML comment on the line before its fence (invisible once
rendered):

``<!-- docs-test: compile-only: WHY -->``: a Python block that needs what CI lacks (a GPU,
several ranks, an object store); it is compiled, its imports are run and every name it
reads must be defined, imported or built in. Every other Python block runs as written.
"""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
LANGUAGES = ("python", "bash", "yaml", "toml", "text")
_FENCE = re.compile(r"^( *)```(\S*)\s*$")
_MARKER = re.compile(r"^\s*<!-- docs-test: (compile-only): (.*?) -->\s*$")


class Block(NamedTuple):
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str  # dedented
    marker: str | None  # "compile-only", or None
    reason: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT).as_posix()}:{self.line}"


def documents() -> list[Path]:
    """Every README and docs page whose blocks are tested."""
    found = [
        ROOT / "README.md",
        *sorted(ROOT.glob("packages/*/README.md")),
        *sorted(ROOT.glob("docs/*.md")),
        ROOT / "bench" / "README.md",
        ROOT / "tools" / "gpu" / "README.md",
        ROOT / "examples" / "third_party_algorithm" / "README.md",
    ]
    return [path for path in found if path.is_file()]


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, language = len(opening.group(1)), opening.group(2)
        end = i + 1
        while not lines[end].strip().startswith("```"):
            end += 1
        body = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = _MARKER.match(before)
        found.append(
            Block(
                path,
                i + 1,
                language,
                body,
                marker.group(1) if marker else None,
                marker.group(2).strip() if marker else "",
            )
        )
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for path in documents() for block in blocks(path)]


def undefined_names(code: str) -> set[str]:
    """Names the code reads that it never binds, imports, or gets from builtins."""
    tree = ast.parse(code)
    bound = set(dir(builtins))
    read = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return read - bound


def imports_only(code: str) -> str:
    """The block's import statements alone, as source."""
    tree = ast.parse(code)
    imports = [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]
    return "\n".join(ast.unparse(node) for node in imports) + "\n"
