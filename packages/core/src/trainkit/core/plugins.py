"""Entry-point discovery. Listing names imports nothing; `load` imports one entry point.

Groups (`GROUPS`):

- ``trainkit.algorithms``: `Algorithm` classes (trainkit-algorithms).
- ``trainkit.callbacks``: `Callback` classes (checkpointing, monitors, profilers).
- ``trainkit.loggers``: `LoggerDestination` classes.
- ``trainkit.parallel``: `ParallelStrategy` classes.
- ``trainkit.schedulers``: learning-rate schedules (trainkit-trainer registers its own:
  ``constant``, ``linear``, ``linear_with_warmup``, ``cosine``, ``cosine_with_warmup``,
  ``multistep``, ``exponential``, ``polynomial``, ``step``, ...).
- ``trainkit.optimizers``: optimizer classes or factories whose first argument is the
  model's parameters (trainkit-trainer registers torch.optim's by class name: ``AdamW``,
  ``SGD``, ...).
- ``trainkit.models`` / ``trainkit.data``: factories by name for config files (a data
  factory returns ``{"train": loader, "eval": loader}``).
- ``trainkit.metrics``: metric classes by name (``cross_entropy``, ``accuracy``, ...).
- ``trainkit.trainers``: trainer classes that ``trainkit train`` can run, each built from
  its ``config_class`` (trainkit-trainer registers its `Trainer` as ``trainkit``).
- ``trainkit.storage``: checkpoint storage back ends, by URL scheme.
- ``trainkit.commands``: ``trainkit`` subcommands, ``main(argv) -> int``.
- ``trainkit.recipes``: named compositions of methods (``recipe: lm_fast`` in a config).

Each of the component groups fills the `TrainerConfig` field of the same name (its slot)
when a config file names an entry point. Third-party packages register in the same groups
as trainkit's own, naming the module that defines the component::

    [project.entry-points."trainkit.algorithms"]
    my_method = "my_package.my_method:MyMethod"
"""

from __future__ import annotations

import difflib
import functools
import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from importlib import metadata
from typing import Any, NamedTuple

__all__ = [
    "GROUPS",
    "PluginInfo",
    "available",
    "describe",
    "did_you_mean",
    "lazy_exports",
    "load",
    "name_hints",
]

GROUPS = (
    "trainkit.algorithms",
    "trainkit.callbacks",
    "trainkit.loggers",
    "trainkit.parallel",
    "trainkit.schedulers",
    "trainkit.optimizers",
    "trainkit.storage",
    "trainkit.commands",
    "trainkit.models",
    "trainkit.data",
    "trainkit.metrics",
    "trainkit.trainers",
    "trainkit.recipes",
)


class PluginInfo(NamedTuple):
    """An installed entry point: its name, what it points to, and who provides it."""

    group: str
    name: str
    value: str
    distribution: str | None


def _entry_points(group: str) -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=group)}


def available(group: str) -> list[str]:
    """Names registered in ``group``, sorted. Nothing is imported."""
    return sorted(_entry_points(group))


def describe(group: str) -> list[PluginInfo]:
    """Every entry point in ``group`` with the distribution that provides it."""
    return [
        PluginInfo(group, ep.name, ep.value, ep.dist.name if ep.dist else None)
        for ep in sorted(_entry_points(group).values(), key=lambda ep: ep.name)
    ]


@functools.cache
def load(group: str, name: str) -> Any:
    """Import and return the object registered as ``name`` in ``group`` (cached).

    Raises:
        LookupError: no such name; the message suggests one and lists the installed ones.
    """
    entry_points = _entry_points(group)
    if name not in entry_points:
        known = ", ".join(sorted(entry_points)) or "none installed"
        raise LookupError(
            f"no {group!r} entry point named {name!r}{did_you_mean(name, entry_points)}; "
            f"available: {known}"
        )
    return entry_points[name].load()


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean 'ema'?"`` for the known name closest to ``name``, or ``""``."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def lazy_exports(
    package: str, modules: Mapping[str, str], hints: Mapping[str, str] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's PEP 562 ``__getattr__`` and ``__dir__``: each public name is imported from
    its module (``modules``: name -> submodule) on first use, so importing the package, or
    one entry point of it, does not import every module::

        __getattr__, __dir__ = lazy_exports(__name__, {"EMA": "ema", ...})

    ``hints`` answers names the package does not have, as `name_hints` does.
    """
    namespace = sys.modules[package].__dict__
    missing = name_hints(package, hints or {})

    def __getattr__(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            return missing(name)
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *modules})

    return __getattr__, __dir__


def name_hints(package: str, hints: Mapping[str, str]) -> Callable[[str], Any]:
    """A module's PEP 562 ``__getattr__`` for names it does not have: a name in ``hints``
    (another library's spelling, e.g. Composer's; or a name whose home is elsewhere) raises
    `ImportError` with its hint; any other name the usual `AttributeError`::

        __getattr__ = name_hints(__name__, {"TensorboardLogger": "use TensorBoardLogger"})

    `ImportError`, because ``from package import Name`` turns an `AttributeError` from
    ``__getattr__`` into a bare "cannot import name" and drops its message.
    """

    def __getattr__(name: str) -> Any:
        hint = hints.get(name)
        if hint is not None:
            raise ImportError(f"{package} has no {name!r}: {hint}", name=package)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
