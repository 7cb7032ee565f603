"""One config dataclass per component, declared once; everything else is derived from it.

A component (the Trainer, an algorithm, a strategy, a callback, a logger destination, a
schedule) declares its options as a keyword-only dataclass with a docstring under each
field, and takes an instance of it::

    @dataclass(kw_only=True)
    class EMAConfig:
        half_life: str = primary("1000ba")  # the field a value given by position fills
        \"\"\"After this long, older weights count half as much.\"\"\"

    class EMA(Algorithm, config=EMAConfig):
        def __init__(self, config: EMAConfig | None = None, /, **options: Any):
            super().__init__(config, **options)   # sets self.config
            ...

    EMA(EMAConfig(half_life="100ba"))  # the config
    EMA(half_life="100ba")             # keyword arguments build the same config
    EMA("100ba")                       # the primary field by position, as Composer

The CLI's YAML schema and its errors, ``trainkit train --print-config``, the logged
hyperparameters and the docs all read these dataclasses (`settings`, `field_docs`,
`to_plain`), so a new field needs no other edit.

A field that holds built objects rather than a plain value (the model, the optimizers,
algorithms, ...) is a *slot*: ``slot("trainkit.algorithms", default_factory=list)``. A config
file fills a slot by naming entry points of that group.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import inspect
import itertools
import os
import textwrap
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from trainkit.core.plugins import did_you_mean

__all__ = [
    "Configurable",
    "attribute_docs",
    "build_config",
    "check_config_class",
    "field_docs",
    "is_slot",
    "primary",
    "primary_field",
    "settings",
    "slot",
    "slot_group",
    "slots",
    "to_plain",
    "unknown_field_hint",
]

C = TypeVar("C")
_SLOT = "trainkit.slot"
_PRIMARY = "trainkit.primary"
_MISSING: Any = dataclasses.MISSING


def slot(group: str | None, *, default: Any = _MISSING, default_factory: Any = _MISSING) -> Any:
    """A config field for built objects, filled in a config file from the entry points of ``group``."""
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={_SLOT: group})
    return dataclasses.field(default=default, metadata={_SLOT: group})


def primary(default: Any = _MISSING, *, default_factory: Any = _MISSING) -> Any:
    """The config field a component's first positional value fills (one per config)."""
    metadata = {_PRIMARY: True}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def primary_field(config_class: type) -> str | None:
    """The name of ``config_class``'s primary field (`primary`), or None."""
    return next((f.name for f in dataclasses.fields(config_class) if _PRIMARY in f.metadata), None)


def is_slot(field: dataclasses.Field[Any]) -> bool:
    return _SLOT in field.metadata


def slot_group(field: dataclasses.Field[Any]) -> str | None:
    """The entry-point group of a slot field (None for a slot no group fills)."""
    return field.metadata[_SLOT]


def settings(config_class: type) -> list[dataclasses.Field[Any]]:
    """The fields that hold plain values (what a config file sets directly)."""
    return [f for f in dataclasses.fields(config_class) if not is_slot(f)]


def slots(config_class: type) -> list[dataclasses.Field[Any]]:
    """The fields that hold built objects."""
    return [f for f in dataclasses.fields(config_class) if is_slot(f)]


def check_config_class(config_class: Any, owner: str) -> None:
    """Raise unless ``config_class`` is a keyword-only dataclass."""
    if not (isinstance(config_class, type) and dataclasses.is_dataclass(config_class)):
        raise TypeError(f"{owner}: config must be a dataclass type, got {config_class!r}")
    positional = [f.name for f in dataclasses.fields(config_class) if not f.kw_only]
    if positional:
        raise TypeError(
            f"{owner}: {config_class.__name__} must be @dataclass(kw_only=True); "
            f"positional fields: {positional}"
        )
    if sum(_PRIMARY in f.metadata for f in dataclasses.fields(config_class)) > 1:
        raise TypeError(f"{owner}: {config_class.__name__} declares 2 or more primary fields")
    if any(f.name == "name" for f in dataclasses.fields(config_class)):
        raise TypeError(
            f"{owner}: {config_class.__name__} has a field called 'name', which config files "
            "and logs use for the component's own name; call it e.g. 'run_name' or 'label'"
        )


def unknown_field_hint(config_class: type, name: str) -> str | None:
    """What to use instead of ``name``, which is not a field of ``config_class``: from the
    class's ``unknown_field_hints`` mapping (a ClassVar; e.g. another library's spelling of
    a setting, and trainkit's), or None."""
    hints = getattr(config_class, "unknown_field_hints", None)
    return hints.get(name) if isinstance(hints, Mapping) else None


def build_config(config_class: type[C], config: Any, options: Mapping[str, Any]) -> C:
    """``config`` (default: the class's defaults) with ``options`` replacing its fields.

    A ``config`` that is not a ``config_class`` fills the class's primary field (`primary`).
    Options are applied with `dataclasses.replace`, which runs ``__post_init__`` again on
    the new values: validate there, but do not rewrite fields (derive values on the
    component instead), or an override would meet the rewritten value.

    Raises:
        TypeError: ``config`` is of another class and there is no primary field for it, or
            an option is not a field; the message names the field and lists the fields.
    """
    if not options and type(config) is config_class:
        return config  # as given (a function that takes a config may run every batch)
    if config is not None and not isinstance(config, config_class):
        if (name := primary_field(config_class)) is None:
            raise TypeError(_not_a_config(config_class.__name__, config_class, config))
        return _built(config_class.__name__, config_class, (name,), (config,), options)
    _check_names(config_class, options)
    if config is None:
        return config_class(**options)
    return dataclasses.replace(config, **options) if options else config  # type: ignore[type-var]


def _built(owner: str, config_class: type[C], names: Any, values: Any, options: Any) -> C:
    """The config with ``values`` in the fields ``names``; its own checks' errors name them."""
    filled = _by_position(owner, names, values, options)
    _check_names(config_class, filled)
    try:
        return config_class(**filled)
    except (TypeError, ValueError) as err:
        given = ", ".join(f"{k}={v!r}" for k, v in filled.items() if k not in options)
        error = TypeError if isinstance(err, TypeError) else ValueError
        raise error(f"{owner}({given}), given by position: {err}") from err


def _check_names(config_class: type, options: Mapping[str, Any]) -> None:
    names = [f.name for f in dataclasses.fields(config_class)]
    unknown = [key for key in options if key not in names]
    if unknown:
        hints = "".join(
            f"; {k}: {h}" for k in unknown if (h := unknown_field_hint(config_class, k))
        )
        # A hint, else the closest name, first; a long list of fields only without either.
        close = "" if hints else did_you_mean(unknown[0], names)
        fields = ", ".join(names) or "none"
        found = bool(hints or close) and len(names) > 12
        listed = "" if found else f"{' Its' if close else '; its'} fields: {fields}"
        raise TypeError(
            f"{config_class.__name__} has no field {', '.join(map(repr, unknown))}{close}{hints}"
            f"{listed}"
        )


def _not_a_config(owner: str, config_class: type, value: Any) -> str:
    name, got = config_class.__name__, type(value).__name__
    fields = ", ".join(f.name for f in dataclasses.fields(config_class))
    if not dataclasses.is_dataclass(value):
        got += f" {value!r}; {owner} takes no value by position ({name} has no primary field)"
    return f"expected a {name}, got {got}; pass a {name} or its fields by keyword: {fields}"


class Configurable:
    """Base of components built from one config dataclass (see the module docstring).

    A subclass names its dataclass with ``class X(Base, config=XConfig)`` and calls
    ``super().__init__(config, **options)``, which sets ``self.config``. A component with
    nothing to configure may declare no config class; its ``config`` is then None.
    """

    config_class: ClassVar[type[Any] | None] = None
    config: Any = None  # also for subclasses whose __init__ does not call super().__init__
    positional: ClassVar[tuple[str, ...]] = ()
    """Fields that may be given by position: the config's `primary` field, or as declared
    (``class X(Base, config=XConfig, positional=("monitor", ...))``) to accept a Composer
    call's positional arguments; a subclass's ``__init__`` then passes ``*values`` through."""

    def __init_subclass__(
        cls, *, config: type | None = None, positional: tuple[str, ...] = (), **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if config is not None:
            check_config_class(config, cls.__name__)
            cls.config_class = config
            name = primary_field(config)
            cls.positional = (name,) if name is not None else ()
        if positional:
            names = {f.name for f in dataclasses.fields(cls.config_class or object)}
            unknown = [p for p in positional if p not in names]
            if unknown:
                raise TypeError(f"{cls.__name__}: positional names unknown fields {unknown}")
            cls.positional = tuple(positional)

    def __init__(self, config: Any = None, /, *values: Any, **options: Any) -> None:
        cls = type(self)
        config_class = cls.config_class
        if config_class is None:
            if config is not None or values or options:
                raise TypeError(
                    f"{cls.__name__} takes no options (it declares no config class; "
                    f"write class {cls.__name__}(..., config=MyConfig) to add some)"
                )
            self.config = None
            return
        if config is not None and not isinstance(config, config_class):
            if not cls.positional:
                raise TypeError(_not_a_config(cls.__name__, config_class, config))
            given = (config, *values)
            self.config = _built(cls.__name__, config_class, cls.positional, given, options)
            return
        if values:
            raise TypeError(
                f"{cls.__name__} takes its config or keyword fields, not {1 + len(values)} "
                f"positional arguments; fields: {', '.join(f.name for f in dataclasses.fields(config_class))}"
            )
        self.config = build_config(config_class, config, options)


def _by_position(
    owner: str, names: tuple[str, ...], values: tuple[Any, ...], options: Mapping[str, Any]
) -> dict[str, Any]:
    """``options`` with ``values`` given to the fields ``names``, in order."""
    if len(values) > len(names):
        raise TypeError(
            f"{owner} takes at most {len(names)} positional arguments "
            f"({', '.join(names)}), got {len(values)}"
        )
    result = dict(options)
    for name, value in zip(names, values, strict=False):
        if name in result:
            raise TypeError(f"{owner} got two values for {name!r} (by position and keyword)")
        result[name] = value
    return result


def to_plain(value: Any) -> Any:
    """``value`` as plain data (for logs, printed configs): dicts, lists, str, numbers.

    Configs become dicts of their fields; a `Configurable` becomes
    ``{"name": <class>, **its config}``; other objects become their class name.
    """
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if _is_plain_printable(value):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Configurable):
        return {"name": type(value).__name__, **(to_plain(value.config) or {})}
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if _is_optimizer(value):
        return {"name": type(value).__name__, **to_plain(value.defaults)}
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if inspect.isroutine(value) or isinstance(value, type):
        return getattr(value, "__qualname__", repr(value))
    return _class_name(value)


def _class_name(value: Any) -> str:
    # FSDP2's fully_shard (and replicate) swap a module's class for one made on the fly:
    # FSDPHuggingFaceModel(FSDPModule, HuggingFaceModel). Name the class the user built.
    cls = type(value)
    while (
        len(cls.__bases__) == 2
        and cls.__bases__[0].__module__.startswith("torch.distributed.")
        and cls.__name__.endswith(cls.__bases__[1].__name__)
    ):
        cls = cls.__bases__[1]
    return cls.__name__


def _is_optimizer(value: Any) -> bool:
    import torch

    return isinstance(value, torch.optim.Optimizer)


def _is_plain_printable(value: Any) -> bool:
    # Small value types whose str() is their meaning (Time, torch.device, torch.dtype).
    from trainkit.core._time import Time

    if isinstance(value, Time):
        return True
    module = type(value).__module__
    return module == "torch" and type(value).__name__ in ("device", "dtype")


@functools.cache
def field_docs(config_class: type) -> dict[str, str]:
    """The docstring under each field of ``config_class`` (and its dataclass bases)."""
    docs: dict[str, str] = {}
    for cls in reversed(config_class.__mro__):
        if cls is object or not dataclasses.is_dataclass(cls):
            continue
        docs.update(attribute_docs(cls))
    return {f.name: docs.get(f.name, "") for f in dataclasses.fields(config_class)}


def attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings under the annotated attributes written in ``cls``'s own body."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, following in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(following.value.value)
    return docs
