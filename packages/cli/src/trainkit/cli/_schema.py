"""What a config file may set on a component, derived from the component's own declaration.

A `Configurable` component's options are the setting fields of its config dataclass: each
value is checked against the field's type annotation (a pydantic model built from the
fields), then the dataclass is constructed so that its own ``__post_init__`` validation
runs too. A plain factory (a torch optimizer, a model or data factory) takes what its
signature takes. Every problem is reported with its field path, the value given and what
is accepted (the type and the field's docstring).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from pydantic import ConfigDict, Field, ValidationError, create_model

from trainkit.core.config import field_docs, is_slot, settings, slot_group, unknown_field_hint

__all__ = [
    "MISSING",
    "ConfigError",
    "Problem",
    "build_checked",
    "check_dataclass",
    "factory_docs",
    "factory_parameters",
    "field_default",
    "field_types",
    "one_line",
    "type_text",
    "unknown_field",
    "unknown_field_of_factory",
    "validate_settings",
]

MISSING: Any = dataclasses.MISSING


class Problem(NamedTuple):
    """One mistake in a config: where (``algorithms.0.half_life``) and what."""

    path: str
    message: str


# --- the fields of a config dataclass ------------------------------------------------------


class ConfigError(ValueError):
    """The config is not valid; the message lists each problem with its field path."""

    def __init__(self, message: str, problems: Sequence[Problem] = ()):
        super().__init__(message)
        self.problems = list(problems)


def field_types(config_class: type) -> dict[str, Any]:
    """The evaluated type annotation of each field (``Any`` where one cannot be evaluated)."""
    try:
        hints = typing.get_type_hints(config_class)
    except Exception:  # a name imported only for type checkers: evaluate field by field
        hints = {}
        for cls in reversed(config_class.__mro__):
            namespace = vars(sys.modules.get(cls.__module__, types.ModuleType("empty")))
            for name, annotation in vars(cls).get("__annotations__", {}).items():
                hints[name] = _evaluate(annotation, namespace)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(config_class)}


def _evaluate(annotation: Any, namespace: dict[str, Any]) -> Any:
    if not isinstance(annotation, str):
        return annotation
    try:
        return eval(annotation, dict(namespace))  # the module's own annotation text
    except Exception:
        return Any


def field_default(field: dataclasses.Field[Any]) -> Any:
    """The field's default value (MISSING for a required field)."""
    if field.default is not MISSING:
        return field.default
    if field.default_factory is not MISSING:
        return field.default_factory()
    return MISSING


@functools.cache
def _settings_model(config_class: type) -> Any:
    """A pydantic model of ``config_class``'s setting fields (names kept as aliases)."""
    hints = field_types(config_class)
    definitions: dict[str, Any] = {}
    for field in settings(config_class):
        annotation = hints[field.name] if _is_schema_type(hints[field.name]) else Any
        required = field.default is MISSING and field.default_factory is MISSING
        definitions[f"f_{field.name}"] = (
            annotation,
            Field(... if required else None, alias=field.name),
        )
    return create_model(
        f"{config_class.__name__}Settings",
        __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=True),
        **definitions,
    )


@functools.cache
def _is_schema_type(annotation: Any) -> bool:
    from pydantic import TypeAdapter

    try:
        TypeAdapter(annotation, config=ConfigDict(arbitrary_types_allowed=True))
    except Exception:  # pydantic cannot check this type: the dataclass itself will
        return False
    return True


def validate_settings(
    config_class: type,
    given: Mapping[str, Any],
    path: str,
    owner: str,
    *,
    with_slots: bool = True,
) -> tuple[dict[str, Any], list[Problem]]:
    """``given`` checked against the setting fields of ``config_class``.

    Returns the validated values of the given fields and the problems found. An unknown
    key's message lists the fields (and, ``with_slots``, the slots a component may fill).
    """
    model = _settings_model(config_class)
    try:
        validated = model.model_validate(dict(given))
    except ValidationError as err:
        return {}, _problems(err, config_class, given, path, owner, with_slots)
    values = {name[2:]: getattr(validated, name) for name in validated.model_fields_set}
    return values, []


def _problems(
    err: ValidationError,
    config_class: type,
    given: Mapping[str, Any],
    path: str,
    owner: str,
    with_slots: bool,
) -> list[Problem]:
    hints, docs = field_types(config_class), field_docs(config_class)
    fields = [f.name for f in settings(config_class)]
    problems: list[Problem] = []
    seen: set[str] = set()
    for error in err.errors():
        name = str(error["loc"][0])
        if name in seen:
            continue  # one message per field (a union fails once per member)
        seen.add(name)
        where = f"{path}.{name}"
        if error["type"] == "extra_forbidden":
            message = unknown_field(name, given[name], config_class, owner, with_slots)
            problems.append(Problem(where, message))
            continue
        if error["type"] == "missing":
            problems.append(
                Problem(
                    where,
                    f"required, not given; accepted: {type_text(hints[name])}"
                    + _doc_suffix(docs.get(name, "")),
                )
            )
            continue
        branches = [e for e in err.errors() if e["loc"] and str(e["loc"][0]) == name]
        message = error["msg"] if len(branches) == 1 else "matches none of the accepted types"
        problems.append(
            Problem(
                where,
                f"{message} (got {given[name]!r}); accepted: {type_text(hints[name])}"
                + _doc_suffix(docs.get(name, "")),
            )
        )
    if not problems:  # pragma: no cover - pydantic always locates its errors
        problems.append(Problem(path, f"{err}; fields: {', '.join(fields)}"))
    return problems


LISTED_FIELDS = 12
"""A config with more fields than this gets a short unknown-field message (the trainer's
~40 fields with their docs would bury the suggestion)."""


def unknown_field(
    name: str, value: Any, config_class: type, owner: str, with_slots: bool = True
) -> str:
    """The message for a key that is not a field: what to use instead, and the fields (each
    with its type and doc, or by name only for a long config)."""
    docs, hints = field_docs(config_class), field_types(config_class)
    fields = [
        f
        for f in dataclasses.fields(config_class)
        if not is_slot(f) or (with_slots and slot_group(f) is not None)
    ]
    close = difflib.get_close_matches(name, [f.name for f in fields], n=1)
    instead = unknown_field_hint(config_class, name)
    hint = f"{instead}. " if instead else f"did you mean {close[0]!r}? " if close else ""
    if len(fields) > LISTED_FIELDS:
        every = (
            f"`trainkit train --print-config` shows all {len(fields)} fields of {owner} "
            "with their meaning"
        )
        if hint:
            return f"unknown field (got {value!r}); {hint}({every})"
        names = ", ".join(f.name for f in fields)
        return f"unknown field (got {value!r}); {owner} takes: {names} ({every})"
    listing = "".join(
        f"\n      {f.name}: "
        + (
            f"a component of {slot_group(f)} ({{name: ...}})"
            if is_slot(f)
            else type_text(hints[f.name])
        )
        + _default_text(f)
        + _doc_suffix(docs.get(f.name, ""))
        for f in fields
    )
    return f"unknown field (got {value!r}); {hint}{owner} takes:{listing or ' no fields'}"


def unknown_field_of_factory(
    name: str, value: Any, factory: Any, owner: str, skip_first: bool = False
) -> str:
    """The message for a key that is not a parameter of ``factory``, listing its parameters."""
    parameters = factory_parameters(factory, skip_first)
    docs = factory_docs(factory)
    close = difflib.get_close_matches(name, [p.name for p in parameters], n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    listing = "".join(
        f"\n      {p.name}"
        + (" (required)" if p.default is p.empty else f" = {p.default!r}")
        + _doc_suffix(docs.get(p.name, ""))
        for p in parameters
    )
    return f"unknown field (got {value!r}); {hint}{owner} takes:{listing or ' no fields'}"


def _default_text(field: dataclasses.Field[Any]) -> str:
    default = field_default(field)
    return " (required)" if default is MISSING else f" = {default!r}"


def _doc_suffix(doc: str) -> str:
    text = one_line(doc)
    return f" -- {text}" if text else ""


def one_line(doc: str) -> str:
    """The first paragraph of a docstring, on one line."""
    paragraph = doc.strip().split("\n\n")[0]
    return " ".join(paragraph.split())


def check_dataclass(
    config_class: type,
    values: Mapping[str, Any],
    path: str,
    fixed: Mapping[str, Any] | None = None,
    *,
    lenient: bool = False,
) -> tuple[Any, list[Problem]]:
    """``config_class(**fixed, **values)``, with its own validation turned into problems.

    The field to blame is found by leaving each given value out in turn: the one whose
    removal makes the config valid is named (``path.field``); otherwise the section is.
    ``lenient``: when even ``config_class(**fixed)`` fails (``fixed`` holds stand-ins for
    objects built later), report nothing and return None.
    """
    fixed = dict(fixed or {})
    if lenient:
        try:
            config_class(**fixed)
        except (ValueError, TypeError):
            return None, []
    return build_checked(lambda **kw: config_class(**fixed, **kw), values, path)


def build_checked(
    make: Callable[..., Any], values: Mapping[str, Any], path: str, label: str = ""
) -> tuple[Any, list[Problem]]:
    """``make(**values)``; a ValueError or TypeError becomes a problem naming the field."""
    try:
        return make(**values), []
    except (ValueError, TypeError) as err:
        failure = err
    blamed, required = [], []
    for name in values:
        rest = {k: v for k, v in values.items() if k != name}
        try:
            make(**rest)
        except TypeError as err:
            if "missing" in str(err) and repr(name) in str(err):
                required.append(name)  # cannot be left out
            continue
        except ValueError:
            continue
        blamed.append(name)
    if not blamed and len(required) == 1:
        # No optional value is at fault: is the one required value, on its own?
        try:
            make(**{required[0]: values[required[0]]})
        except (ValueError, TypeError):
            blamed = required
    if len(blamed) != 1:
        return None, [Problem(path, f"{label}{failure}")]
    value = repr(values[blamed[0]])
    got = "" if value in str(failure) else f" (got {value})"
    return None, [Problem(f"{path}.{blamed[0]}", f"{label}{failure}{got}")]


# --- plain factories -----------------------------------------------------------------------


def factory_parameters(factory: Any, skip_first: bool = False) -> list[inspect.Parameter]:
    """The keyword-settable parameters of ``factory`` (``skip_first``: the optimizer's params)."""
    try:
        parameters = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return []
    if skip_first and parameters:
        parameters = parameters[1:]
    return [p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


@functools.cache
def factory_docs(factory: Any) -> dict[str, str]:
    """Each parameter's text in the ``Args:`` section of ``factory``'s docstring."""
    doc = inspect.getdoc(factory) or ""
    match = re.search(r"^(\s*)Args:\s*$", doc, flags=re.M)
    if not match:
        return {}
    docs: dict[str, str] = {}
    indent, current = None, None
    for line in doc[match.end() :].splitlines()[1:]:
        if not line.strip():
            continue
        width = len(line) - len(line.lstrip())
        if width <= len(match.group(1)):
            break  # the next section
        if indent is None:
            indent = width
        entry = re.match(r"\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line.strip())
        if width == indent and entry:
            current = entry.group(1)
            docs[current] = entry.group(2)
        elif current is not None:
            docs[current] = f"{docs[current]} {line.strip()}".strip()
    return docs


# --- types as text -------------------------------------------------------------------------


def type_text(annotation: Any) -> str:
    """``Time | str | int | None`` for people (``any`` where nothing is declared)."""
    if annotation is Any:
        return "any"
    if annotation is type(None) or annotation is None:
        return "None"
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(annotation))
    if origin is typing.Annotated:
        return type_text(typing.get_args(annotation)[0])
    if origin is not None:
        from collections import abc

        if origin is abc.Callable:
            return "callable (Python only)"
        args = ", ".join(type_text(a) for a in typing.get_args(annotation))
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{args}]" if args else name
    if isinstance(annotation, type):
        module = annotation.__module__
        if module == "builtins" or module.startswith("trainkit."):
            return annotation.__name__
        return f"{module.split('.')[0]}.{annotation.__name__}"
    return str(annotation)
