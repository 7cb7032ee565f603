"""The ``trainkit train`` config: YAML whose schema is derived from the components' own
config dataclasses, so a field added to a config is settable here with no other edit.

Sections (`sections` lists them, from `trainkit.trainer.TrainerConfig`):

- ``trainer``: every setting field of `TrainerConfig` (``max_duration``, ``precision``,
  ``seed``, ``run_name``, ...), each checked against its type annotation and then by the
  dataclass's own validation.
- one section per slot field of `TrainerConfig`: ``model``, ``optimizers``, ``schedulers``,
  ``algorithms``, ``callbacks``, ``loggers``, ``parallelism``. Each holds a component (or a
  list of them) ``{name: <entry point of the slot's group, or module:factory>, **fields}``.
  A `Configurable` component's fields are those of its config dataclass; a plain factory's
  are its parameters (an optimizer's first parameter, the model's parameters, is given).
- ``data``: a ``trainkit.data`` factory; its ``{"train": loader, "eval": loader}`` fill the
  dataloader slots.
- ``checkpoint``: the fields of the ``checkpointer`` callback's config, with ``folder``
  defaulting to ``<run_dir>/checkpoints`` and ``autoresume`` to true (re-running a config
  resumes it); ``null`` turns checkpointing off.

``recipe: NAME`` merges a registered recipe's sections into the config first
(`trainkit.cli._recipe`): its algorithms before the config's own, its schedule or optimizer
where the config sets none.

A metrics file (the ``file`` logger, writing to the run directory) is added to ``loggers``
when it is installed and not configured.

A ``module:factory`` name may name a module beside the config file (`trainkit.cli._resolve`).
Once every section is valid, values that must agree across sections are checked
(`trainkit.cli._agree`: the data's sequence length and the model's positions, ...), so a
config error stops the run before anything is built or written.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainkit.cli._agree import check_across
from trainkit.cli._component import OPTIMIZER_GROUP, Component, Slot, build_slot
from trainkit.cli._overrides import apply_overrides
from trainkit.cli._recipe import RECIPE, expand_recipe
from trainkit.cli._resolve import choices, config_folder, resolve
from trainkit.cli._schema import (
    MISSING,
    ConfigError,
    Problem,
    check_dataclass,
    factory_parameters,
    field_default,
    field_types,
    unknown_field_of_factory,
    validate_settings,
)
from trainkit.cli._trainer import trainer_config_class
from trainkit.cli._yaml import load as load_yaml
from trainkit.core import plugins
from trainkit.core.config import (
    Configurable,
    field_docs,
    settings,
    slot_group,
    slots,
    to_plain,
)

__all__ = [
    "Component",
    "ConfigError",
    "RunConfig",
    "Section",
    "apply_overrides",
    "load_config",
    "sections",
]

TRAINER = "trainer"
DATA = "data"
CHECKPOINT = "checkpoint"
DATA_GROUP = "trainkit.data"
LOGGER_GROUP = "trainkit.loggers"
CHECKPOINTER = ("trainkit.callbacks", "checkpointer")
FILE_LOGGER = "file"


# --- the schema, derived from the trainer's config class --------------------------------------------------


@dataclass(frozen=True)
class Section:
    """A section of the config file that fills slot fields of `TrainerConfig`."""

    key: str
    """The section's name in the file."""
    group: str
    """The entry-point group its components are named from."""
    doc: str
    """What it is (the slot's docstring)."""
    many: bool | None
    """True: a list of components; False: one; None: either."""
    required: bool
    """The run cannot be built without it."""
    fills: tuple[str, ...]
    """The `TrainerConfig` fields it fills."""


def sections() -> list[Section]:
    """The component sections, in `TrainerConfig`'s order (``data`` where its first loader is)."""
    config_class = trainer_config_class()
    hints, docs = field_types(config_class), field_docs(config_class)
    data_slots = [f.name for f in slots(config_class) if slot_group(f) == DATA_GROUP]
    result: list[Section] = []
    for slot_field in slots(config_class):
        group = slot_group(slot_field)
        if group is None:
            continue  # filled in Python only
        if group == DATA_GROUP:
            if slot_field.name == data_slots[0]:
                result.append(
                    Section(
                        DATA,
                        DATA_GROUP,
                        "The data: a factory returning a dict of loaders ("
                        + f'"{_data_key(data_slots[0])}" is required).\n\n'
                        + "\n\n".join(f'"{_data_key(n)}" fills {n}: {docs[n]}' for n in data_slots),
                        many=False,
                        required=True,
                        fills=tuple(data_slots),
                    )
                )
            continue
        result.append(
            Section(
                slot_field.name,
                group,
                docs[slot_field.name],
                _cardinality(hints[slot_field.name]),
                required=field_default(slot_field) is MISSING,
                fills=(slot_field.name,),
            )
        )
    return result


def _data_key(slot_name: str) -> str:
    return slot_name.removesuffix("_dataloader")


def _cardinality(annotation: Any) -> bool | None:
    if annotation is Any:
        return None
    members = (
        typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else (annotation,)
    )
    for member in members:
        origin = typing.get_origin(member) or member
        if isinstance(origin, type) and issubclass(origin, Sequence) and origin is not str:
            return True
    return False


# --- a validated config --------------------------------------------------------------------


@dataclass
class RunConfig:
    """What ``trainkit train`` runs: every section validated, defaults filled in."""

    source: Path | None
    """The config file (None: the embedded default)."""
    run_dir: Path
    """Where the run writes."""
    trainer: dict[str, Any]
    """Every setting field of `TrainerConfig`, with its value."""
    components: dict[str, Slot]
    """Each component section by key (`sections`), in order."""
    checkpoint: Component | None
    """The checkpointer, or None (turned off, or trainkit-checkpoint not installed)."""
    notes: list[str] = field(default_factory=list)
    """Things the user should know (a section ignored, ...)."""
    from_run_dir: set[str] = field(default_factory=set)
    """Paths of the values derived from ``run_dir``, not given (``trainer.run_name``,
    ``checkpoint.folder``, the metrics file's logger): ``--print-config`` leaves them unset,
    so that a copy of its output writes to a run directory of its own."""

    def plain(self) -> dict[str, Any]:
        """The resolved config as plain data, every value filled in."""
        result: dict[str, Any] = {}
        for key, value in self.components.items():
            if isinstance(value, list):
                result[key] = [c.plain() for c in value]
            else:
                result[key] = value.plain() if value is not None else None
        result[CHECKPOINT] = (
            {k: v for k, v in self.checkpoint.plain().items() if k != "name"}
            if self.checkpoint is not None
            else None
        )
        result[TRAINER] = {k: to_plain(v) for k, v in self.trainer.items()}
        return result

    def to_yaml(self, portable: bool = False) -> str:
        """The resolved config as YAML, each field's docstring above it as a comment;
        ``portable``: without the values `from_run_dir` (what ``--print-config`` prints)."""
        from trainkit.cli._print import config_yaml

        return config_yaml(self, portable)


# --- reading -------------------------------------------------------------------------------


def load_config(
    path: Path | None,
    overrides: Sequence[str] = (),
    base: dict[str, Any] | None = None,
    run_dir: Path | None = None,
) -> RunConfig:
    """Read, override and validate a config; ``base`` is used when ``path`` is None.

    ``run_dir`` defaults to ``runs/<trainer.run_name, or the file's stem, or "default">``.
    """
    raw: dict[str, Any] = copy.deepcopy(base or {})
    if path is not None:
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        raw = load_yaml(path.read_text()) or {}
        if not isinstance(raw, dict):
            raise ConfigError(
                f"{path} must hold a mapping of sections (model, data, trainer, ...), not a {type(raw).__name__}"
            )
    raw = apply_overrides(raw, list(overrides))
    return validate(raw, path, run_dir)


def validate(raw: Mapping[str, Any], source: Path | None, run_dir: Path | None) -> RunConfig:
    """``raw`` checked section by section; every problem is reported at once."""
    with config_folder(source.resolve().parent if source is not None else None):
        return _validate(raw, source, run_dir)


def _validate(raw: Mapping[str, Any], source: Path | None, run_dir: Path | None) -> RunConfig:
    problems: list[Problem] = []
    notes: list[str] = []
    raw = expand_recipe(raw, problems, notes)
    component_sections = sections()
    known = [TRAINER, *(s.key for s in component_sections), CHECKPOINT]
    for key in raw:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append(
                Problem(str(key), f"unknown section{hint} Sections: {', '.join([*known, RECIPE])}")
            )

    trainer = _trainer_settings(raw.get(TRAINER), problems)
    name = trainer["run_name"] or (source.stem if source is not None else "default")
    run_dir = run_dir if run_dir is not None else Path("runs") / name
    from_run_dir: set[str] = set()
    if trainer["run_name"] is None:
        trainer["run_name"] = run_dir.name
        from_run_dir.add(f"{TRAINER}.run_name")

    components: dict[str, Slot] = {}
    for section in component_sections:
        components[section.key] = _section(section, raw.get(section.key, MISSING), problems)
    added = _add_metrics_file(components, component_sections, run_dir, problems)
    checkpoint, more = _checkpoint(raw.get(CHECKPOINT, {}), run_dir, problems)
    notes += more
    from_run_dir |= {added.path} if added is not None else set()
    if checkpoint is not None and "folder" not in (raw.get(CHECKPOINT) or {}):
        from_run_dir.add(f"{CHECKPOINT}.folder")
    if not problems:  # each section is valid on its own: do they fit together?
        found, across = check_across(trainer, components, checkpoint)
        problems += found
        notes += across
    if problems:
        where = str(source) if source is not None else "the default config"
        lines = [f"{where} is not valid:", *(f"  {p.path}: {p.message}" for p in problems)]
        raise ConfigError("\n".join(lines), problems)
    return RunConfig(source, run_dir, trainer, components, checkpoint, notes, from_run_dir)


def _trainer_settings(given: Any, problems: list[Problem]) -> dict[str, Any]:
    config_class = trainer_config_class()
    defaults = {f.name: field_default(f) for f in settings(config_class)}
    if given is None:
        given = {}
    if not isinstance(given, Mapping):
        problems.append(Problem(TRAINER, f"must be a mapping of fields, got {given!r}"))
        return defaults
    values, found = validate_settings(config_class, given, TRAINER, "the trainer", with_slots=False)
    problems += found
    if not found:
        # The dataclass's own checks, with stand-ins for the objects built later.
        stand_ins = {f.name: None for f in slots(config_class) if field_default(f) is MISSING}
        _, found = check_dataclass(config_class, values, TRAINER, stand_ins, lenient=True)
        problems += found
    return {**defaults, **values}


def _section(
    section: Section, value: Any, problems: list[Problem], path: str | None = None
) -> Slot:
    path = path or section.key
    if value is MISSING or value is None:
        if section.required:
            problems.append(Problem(path, f"required, not given; {choices(section.group)}"))
        return [] if section.many else None
    if isinstance(value, list):
        if section.many is False:
            problems.append(Problem(path, f"takes one component, got a list of {len(value)}"))
            return None
        built = [
            _component(item, f"{path}.{i}", section.group, problems) for i, item in enumerate(value)
        ]
        return [c for c in built if c is not None]
    one = _component(value, path, section.group, problems)
    if section.many:
        return [one] if one is not None else []
    return one


def _component(item: Any, path: str, group: str, problems: list[Problem]) -> Component | None:
    if isinstance(item, str):
        item = {"name": item}
    if not isinstance(item, Mapping):
        problems.append(
            Problem(path, f"must be {{name: ..., <field>: <value>, ...}}, got {item!r}")
        )
        return None
    name = item.get("name")
    if not isinstance(name, str) or not name:
        problems.append(Problem(path, f"needs a name; {choices(group)}"))
        return None
    try:
        target = resolve(group, name)
    except ConfigError as err:
        problems.append(Problem(path, str(err)))
        return None
    options = {str(k): v for k, v in item.items() if k != "name"}
    component = Component(path, group, name, target, options)
    found = _check_options(component)
    problems += found
    return None if found else component


def _check_options(component: Component) -> list[Problem]:
    """Validate ``component.options`` against its config dataclass, or its signature."""
    target, path, name = component.target, component.path, component.name
    if component.configurable:
        config_class = target.config_class
        if config_class is None:
            return [
                Problem(f"{path}.{key}", f"unknown field (got {value!r}); {name} takes no options")
                for key, value in component.options.items()
            ]
        nested = {
            f.name: f
            for f in slots(config_class)
            if f.name in component.options and slot_group(f) is not None
        }
        given = {k: v for k, v in component.options.items() if k not in nested}
        values, problems = validate_settings(config_class, given, path, name)
        hints = field_types(config_class)
        for slot_name, slot_field in nested.items():
            inner = Section(
                slot_name,
                slot_group(slot_field),
                "",
                _cardinality(hints[slot_name]),
                required=False,
                fills=(slot_name,),
            )
            value = component.options[slot_name]
            component.children[slot_name] = _section(inner, value, problems, f"{path}.{slot_name}")
        if problems:
            return problems
        component.options = values
        try:
            built = {k: build_slot(v) for k, v in component.children.items()}
        except ValueError as err:
            return [Problem(path, str(err))]
        component.config, problems = check_dataclass(config_class, values, path, built)
        return problems
    skip_first = component.group == OPTIMIZER_GROUP
    if not callable(target):
        return [Problem(path, f"{name} is {target!r}, not a class or factory")]
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return []  # nothing to check against: the call will tell
    if any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values()):
        return []
    parameters = factory_parameters(target, skip_first)
    names = {p.name for p in parameters}
    problems = [
        Problem(f"{path}.{key}", unknown_field_of_factory(key, value, target, name, skip_first))
        for key, value in component.options.items()
        if key not in names
    ]
    problems += [
        Problem(
            f"{path}.{p.name}", f"required, not given; {name} takes: {', '.join(sorted(names))}"
        )
        for p in parameters
        if p.default is p.empty and p.name not in component.options
    ]
    return problems


def accepted_fields(target: Any, group: str) -> list[str]:
    """The field names a config may give ``target``."""
    if isinstance(target, type) and issubclass(target, Configurable):
        config_class = target.config_class
        return [f.name for f in settings(config_class)] if config_class is not None else []
    return [p.name for p in factory_parameters(target, group == OPTIMIZER_GROUP)]


def _add_metrics_file(
    components: dict[str, Slot],
    component_sections: list[Section],
    run_dir: Path,
    problems: list[Problem],
) -> Component | None:
    """The ``file`` logger writing to the run directory, unless the config names it."""
    section = next((s for s in component_sections if s.group == LOGGER_GROUP and s.many), None)
    if section is None or FILE_LOGGER not in plugins.available(LOGGER_GROUP):
        return None
    loggers = components[section.key]
    if not isinstance(loggers, list) or any(c.name == FILE_LOGGER for c in loggers):
        return None
    target = plugins.load(LOGGER_GROUP, FILE_LOGGER)
    item: dict[str, Any] = {"name": FILE_LOGGER}
    if "folder" in accepted_fields(target, LOGGER_GROUP):
        item["folder"] = str(run_dir)
    added = _component(item, f"{section.key}.{len(loggers)}", LOGGER_GROUP, problems)
    if added is not None:
        loggers.append(added)
    return added


def _checkpoint(
    given: Any, run_dir: Path, problems: list[Problem]
) -> tuple[Component | None, list[str]]:
    if given is None:
        return None, []
    group, name = CHECKPOINTER
    if name not in plugins.available(group):
        return None, ["trainkit-checkpoint is not installed, so this run will not be resumable"]
    if not isinstance(given, Mapping):
        problems.append(Problem(CHECKPOINT, f"must be a mapping of fields or null, got {given!r}"))
        return None, []
    if "name" in given:
        problems.append(
            Problem(
                f"{CHECKPOINT}.name",
                "the checkpoint section takes the checkpointer's fields, not a name",
            )
        )
        return None, []
    accepted = accepted_fields(plugins.load(group, name), group)
    defaults = {"folder": str(run_dir / "checkpoints"), "autoresume": True}
    item = {
        "name": name,
        **{k: v for k, v in defaults.items() if k in accepted},
        **given,
    }
    return _component(item, CHECKPOINT, group, problems), []
