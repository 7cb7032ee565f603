"""A component named in a config file, validated, and how it is built and printed."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any

from trainkit.cli._schema import factory_docs, factory_parameters
from trainkit.core.config import Configurable, field_docs, to_plain

__all__ = ["OPTIMIZER_GROUP", "Component", "Slot", "build_slot"]

OPTIMIZER_GROUP = "trainkit.optimizers"


@dataclass
class Component:
    """A component named in the config, validated; `build` makes it."""

    path: str
    """Where it is in the file (``algorithms.0``)."""
    group: str
    name: str
    """The entry point, or ``module:factory``."""
    target: Any
    """The class or factory the name resolves to."""
    options: dict[str, Any]
    """The fields the file gave, validated (components given for slot fields excluded)."""
    config: Any = None
    """A `Configurable`'s config dataclass, built from ``options`` and ``children``."""
    children: dict[str, Slot] = field(default_factory=dict)
    """Components the file gave for slot fields of the config (FSDP's ``tensor_parallel``)."""

    @property
    def configurable(self) -> bool:
        return isinstance(self.target, type) and issubclass(self.target, Configurable)

    def fields(self) -> list[tuple[str, Any, str]]:
        """(name, value, doc) of every field, defaults filled in; a slot field the file
        filled holds its `Component` (or list of them)."""
        if self.configurable:
            if self.config is None:
                return []
            docs = field_docs(type(self.config))
            return [
                (f.name, self.children.get(f.name, getattr(self.config, f.name)), docs[f.name])
                for f in dataclasses.fields(self.config)
            ]
        docs = factory_docs(self.target)
        rows = []
        for parameter in factory_parameters(self.target, self.group == OPTIMIZER_GROUP):
            value = self.options.get(parameter.name, parameter.default)
            if value is inspect.Parameter.empty:
                continue
            rows.append((parameter.name, value, docs.get(parameter.name, "")))
        known = {name for name, _, _ in rows}
        rows += [(k, v, "") for k, v in self.options.items() if k not in known]  # **kwargs
        return rows

    def plain(self) -> dict[str, Any]:
        """``{"name": ..., **fields}`` as plain data."""
        return {"name": self.name, **{n: _plain(v) for n, v, _ in self.fields()}}

    def build(self, *leading: Any) -> Any:
        """The component (``leading``: the optimizer's parameters)."""
        if not self.configurable:
            return self.target(*leading, **self.options)
        if self.config is None:
            return self.target()
        if not self.children:
            return self.target(self.config)
        built = {name: build_slot(child) for name, child in self.children.items()}
        return self.target(dataclasses.replace(self.config, **built))


Slot = Component | list[Component] | None


def build_slot(value: Slot) -> Any:
    """The object(s) of a slot's component(s)."""
    if isinstance(value, list):
        return [c.build() for c in value]
    return value.build() if value is not None else None


def _plain(value: Any) -> Any:
    if isinstance(value, Component):
        return value.plain()
    if isinstance(value, list) and value and isinstance(value[0], Component):
        return [c.plain() for c in value]
    return to_plain(value)
