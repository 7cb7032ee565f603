"""Regenerate the lists in docs/*.md from the code, so the docs cannot drift.

    uv run python docs/generate.py          # rewrite the generated blocks
    uv run python docs/generate.py --check  # exit 1 if a block is out of date (a test runs this)

A generated block sits between ``<!-- generated: NAME -->`` and ``<!-- end: NAME -->``.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path

DOCS = Path(__file__).resolve().parent


def _first_line(text: str | None) -> str:
    return inspect.cleandoc(text or "").split("\n\n")[0].replace("\n", " ").strip()


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def events() -> str:
    from trainkit.core import Event

    return "\n".join(f"- `{e.name}` (`{e.value}`)" for e in Event)


def groups() -> str:
    from trainkit.core import plugins

    lines = ["| group | registered here |", "|---|---|"]
    for group in plugins.GROUPS:
        by_dist: dict[str, list[str]] = {}
        for info in plugins.describe(group):
            if info.distribution and info.distribution.startswith("trainkit-"):
                by_dist.setdefault(info.distribution, []).append(info.name)
        where = "; ".join(
            f"{dist}: {', '.join(sorted(names))}" for dist, names in sorted(by_dist.items())
        )
        lines.append(f"| `{group}` | {where or 'none yet (for other packages)'} |")
    return "\n".join(lines)


def trainer_config() -> str:
    from trainkit.core.config import field_docs, is_slot, slot_group
    from trainkit.trainer import TrainerConfig

    docs = field_docs(TrainerConfig)
    lines = ["| field | kind | default | meaning |", "|---|---|---|---|"]
    for field in dataclasses.fields(TrainerConfig):
        kind = f"slot (`{slot_group(field)}`)" if is_slot(field) else "setting"
        if field.default is not dataclasses.MISSING:
            default = repr(field.default)
        elif field.default_factory is not dataclasses.MISSING:
            default = repr(field.default_factory())
        else:
            default = "required"
        lines.append(
            f"| `{field.name}` | {kind} | `{default}` | {_cell(_first_line(docs[field.name]))} |"
        )
    return "\n".join(lines)


def _members(cls: type) -> list[str]:
    from trainkit.core import Event

    events = {e.value for e in Event}
    lines = []
    if events <= set(vars(cls)):
        lines.append(
            "  - one no-op method per event, named after it (`batch_end(state, logger)` for "
            "`Event.BATCH_END`, ...)"
        )
    for name, value in vars(cls).items():
        if name.startswith("_") or name in ("config_class",) or name in events:
            continue
        if isinstance(value, property):
            doc, kind = value.__doc__, "property"
        elif inspect.isfunction(value):
            doc = value.__doc__
            kind = "abstract" if getattr(value, "__isabstractmethod__", False) else "method"
        else:
            continue
        if isinstance(value, property) and getattr(value.fget, "__isabstractmethod__", False):
            kind = "abstract property"
        lines.append(f"  - `{name}` ({kind}): {_first_line(doc)}")
    return lines


def _class_attributes(cls: type) -> list[str]:
    from trainkit.core.config import attribute_docs

    docs = attribute_docs(cls)
    return [
        f"  - `{name}` = `{vars(cls)[name]!r}`: {_first_line(doc)}"
        for name, doc in docs.items()
        if name in vars(cls)
    ]


def protocols() -> str:
    from trainkit.core import Algorithm, Callback, LoggerDestination, ParallelStrategy, Precision

    out = []
    for cls in (Algorithm, Callback, LoggerDestination, ParallelStrategy, Precision):
        out.append(f"- **`{cls.__name__}`**: {_first_line(cls.__doc__)}")
        out.extend(_class_attributes(cls))
        out.extend(_members(cls))
    return "\n".join(out)


def components() -> str:
    """Every Configurable component registered by a trainkit package, with its fields."""
    from trainkit.core import plugins
    from trainkit.core.config import Configurable, field_docs

    out = []
    for group in plugins.GROUPS:
        rows = []
        for info in plugins.describe(group):
            if not (info.distribution or "").startswith("trainkit-"):
                continue
            try:
                obj = plugins.load(group, info.name)
            except ImportError:  # an optional extra that is not installed
                continue
            if not (isinstance(obj, type) and issubclass(obj, Configurable)):
                continue
            config = obj.config_class
            fields = (
                ", ".join(
                    f"`{f.name}`"
                    + (
                        f" ({_first_line(field_docs(config)[f.name])})"
                        if field_docs(config)[f.name]
                        else ""
                    )
                    for f in dataclasses.fields(config)
                )
                if config is not None
                else "no options"
            )
            rows.append(f"| `{info.name}` | `{info.value}` | {_cell(fields)} |")
        if rows:
            out += [
                f"### `{group}`",
                "",
                "| name | class | config fields |",
                "|---|---|---|",
                *rows,
                "",
            ]
    return "\n".join(out).rstrip()


GENERATORS: dict[str, Callable[[], str]] = {
    "events": events,
    "groups": groups,
    "trainer-config": trainer_config,
    "protocols": protocols,
    "components": components,
}
BLOCK = re.compile(r"(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- end: \2 -->)", re.S)


def render(text: str) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in GENERATORS:
            raise KeyError(f"unknown generated block {name!r}; known: {sorted(GENERATORS)}")
        return f"{match.group(1)}{GENERATORS[name]()}\n{match.group(4)}"

    return BLOCK.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a block is out of date")
    args = parser.parse_args(argv)
    stale = []
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text()
        new = render(text)
        if new != text:
            stale.append(path.name)
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(
            f"out of date: {', '.join(stale)}; run `uv run python docs/generate.py`",
            file=sys.stderr,
        )
        return 1
    print("rewrote: " + ", ".join(stale) if stale else "docs are current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
