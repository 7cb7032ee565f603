"""The import graph of one trainkit package, read from its source (nothing is imported).

Every ``import`` and ``from ... import`` counts, at module level or inside a function,
except those under ``if TYPE_CHECKING:`` (type-only imports may point back).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "packages"


def package_modules(package: str, root: Path | None = None) -> dict[str, Path]:
    """``{"trainkit.core._state": path, ...}`` for ``package`` (e.g. ``"trainkit.core"``),
    read from ``root`` (default: the package's folder in this repository)."""
    if root is None:
        name = package.split(".")[1]
        root = SRC / name / "src" / "trainkit" / name
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join((package, *parts))] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names]))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(package: str, root: Path | None = None) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports at run time."""
    modules = package_modules(package, root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for module, names in _imports(ast.parse(path.read_text())):
            if module not in modules:
                continue
            submodules = [f"{module}.{n}" for n in names if f"{module}.{n}" in modules]
            graph[name].update(submodules or [module])
            if len(submodules) < len(names):  # a name from the module itself
                graph[name].add(module)
        graph[name].discard(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def exported_twice(package: str) -> dict[str, list[str]]:
    """Names that ``package`` and its public submodules export (``__all__``) from more than
    one place: ``{name: [modules]}``."""
    import importlib

    homes: dict[tuple[int, str], list[str]] = {}
    public = [name for name in package_modules(package) if "._" not in name]
    for module_name in public:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            homes.setdefault((id(getattr(module, name)), name), []).append(module_name)
    return {name: modules for (_, name), modules in homes.items() if len(modules) > 1}
