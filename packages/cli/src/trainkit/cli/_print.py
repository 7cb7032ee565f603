"""The resolved config as YAML, every field's docstring above it as a comment.

The output is itself a valid config: loading it again gives the same run. Values a config
file cannot hold (objects a component was given in Python) are shown commented out.

``--print-config`` prints it *portable*: the values derived from the run directory and not
given (the run's name, the checkpoint folder, the metrics file's logger) are left unset, so
that a copy of the output, saved as ``my_run.yaml``, trains in ``runs/my_run/`` instead of
writing into the run it was printed from.
"""

from __future__ import annotations

import json
import math
import textwrap
from typing import TYPE_CHECKING, Any

import yaml

from trainkit.cli._config import CHECKPOINT, TRAINER, Component, sections
from trainkit.cli._trainer import trainer_config_class
from trainkit.core import Time
from trainkit.core.config import field_docs, to_plain

if TYPE_CHECKING:
    from trainkit.cli._config import RunConfig

__all__ = ["config_yaml", "is_yaml_value"]

HEADER = """\
# trainkit train: the resolved config. Every field is shown with its value (defaults filled
# in) and, above it, what it means. A component is {name: <entry point or module:factory>,
# <field>: <value>, ...}; `trainkit plugins` lists the installed names. Lines commented out
# hold objects a config file cannot give; set them in Python.
"""
WIDTH = 92
RUN_DIR = "runs/{run_name}"
"""The run directory, as printed: ``--run-dir``, or runs/ and the run's name (by default the
config file's name)."""

Row = tuple[str, Any, str]  # (key, value, doc)


def config_yaml(config: RunConfig, portable: bool = False) -> str:
    """``config`` as YAML; ``portable``: leave unset what the run directory gave."""
    unset = config.from_run_dir if portable else set()
    lines = [HEADER.rstrip("\n")]
    for section in sections():
        value = config.components[section.key]
        lines.append("")
        lines += _comment(section.doc, 0)
        if isinstance(value, list):
            left_out = [c for c in value if c.path in unset]
            value = [c for c in value if c.path not in unset]
            lines += [
                f"# (unset: a {c.name!r} logger writing in the run directory)" for c in left_out
            ]
            if not value:
                lines.append(f"{section.key}: []")
                continue
            lines.append(f"{section.key}:")
            for component in value:
                lines += _list_item(_rows(component), 2)
        elif value is None:
            lines.append(f"{section.key}: null")
        else:
            lines.append(f"{section.key}:")
            lines += _mapping(_rows(value), 2)

    lines.append("")
    lines += _comment(
        "Saving and resuming the run: the fields of the checkpointer (null: no checkpoints).", 0
    )
    if config.checkpoint is None:
        lines.append(f"{CHECKPOINT}: null")
        lines += [f"# {note}" for note in config.notes]
    else:
        lines.append(f"{CHECKPOINT}:")
        rows = config.checkpoint.fields()
        if f"{CHECKPOINT}.folder" in unset:
            rows = [row for row in rows if row[0] != "folder"]
            lines.append(f"  # folder: {RUN_DIR}/checkpoints  (unset: in the run directory)")
        lines += _mapping(rows, 2)

    lines.append("")
    lines += _comment("The Trainer's settings (trainkit.trainer.TrainerConfig).", 0)
    docs = field_docs(trainer_config_class())
    lines.append(f"{TRAINER}:")
    settings = dict(config.trainer)
    if f"{TRAINER}.run_name" in unset:
        settings["run_name"] = None
    for line in _mapping([(k, v, docs.get(k, "")) for k, v in settings.items()], 2):
        if line == "  run_name: null" and f"{TRAINER}.run_name" in unset:
            line += "  # unset: the config file's name (or --run-dir's)"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _rows(component: Component) -> list[Row]:
    return [("name", component.name, ""), *component.fields()]


def _mapping(rows: list[Row], indent: int) -> list[str]:
    lines: list[str] = []
    pad = " " * indent
    for key, value, doc in rows:
        lines += _comment(doc, indent)
        if isinstance(value, Time):
            value = str(value)  # "1ep": what a config file gives
        if isinstance(value, Component):  # a slot of the config, filled by the file
            lines.append(f"{pad}{key}:")
            lines += _mapping(_rows(value), indent + 2)
        elif isinstance(value, list) and value and isinstance(value[0], Component):
            lines.append(f"{pad}{key}:")
            for component in value:
                lines += _list_item(_rows(component), indent + 2)
        elif is_yaml_value(value):
            lines.append(f"{pad}{key}: {_inline(value)}")
        else:
            lines.append(f"{pad}# {key}: {_inline(to_plain(value))}  (an object: set it in Python)")
    return lines


def _list_item(rows: list[Row], indent: int) -> list[str]:
    lines = _mapping(rows, indent + 2)
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("#"):
            lines[i] = " " * indent + "- " + line[indent + 2 :]
            break
    return lines


def _comment(doc: str, indent: int) -> list[str]:
    pad = " " * indent + "# "
    lines: list[str] = []
    for paragraph in doc.strip().split("\n\n"):
        lines += textwrap.wrap(
            " ".join(paragraph.split()),
            WIDTH - len(pad),
            break_on_hyphens=False,
            break_long_words=False,
        )
    return [pad + line for line in lines]


def _inline(value: Any) -> str:
    value = _listify(value)
    if isinstance(value, str) and ("\n" in value or value != value.strip()):
        return json.dumps(value)  # a JSON string is a YAML double-quoted scalar
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, sort_keys=False)
    return "\n".join(line for line in text.splitlines() if line != "...").strip()


def _listify(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_listify(v) for v in value]
    if isinstance(value, dict):
        return {k: _listify(v) for k, v in value.items()}
    return value


def is_yaml_value(value: Any) -> bool:
    """Whether a config file can give ``value`` (plain data, tuples as lists)."""
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list | tuple):
        return all(is_yaml_value(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_yaml_value(v) for k, v in value.items())
    return False
