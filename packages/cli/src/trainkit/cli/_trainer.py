"""The trainer ``trainkit train`` runs, found by entry point as models and data are.

trainkit-trainer registers its `Trainer` in the ``trainkit.trainers`` group as ``trainkit``;
the CLI never imports it. The config file's ``trainer`` section and component sections are
derived from the trainer's ``config_class``.
"""

from __future__ import annotations

from typing import Any

from trainkit.core import plugins

__all__ = ["TRAINERS", "trainer_class", "trainer_config_class"]

TRAINERS = "trainkit.trainers"
DEFAULT_TRAINER = "trainkit"


def trainer_class(name: str = DEFAULT_TRAINER) -> Any:
    """The trainer class registered as ``name`` (built from one config object)."""
    if name not in plugins.available(TRAINERS):
        installed = ", ".join(plugins.available(TRAINERS)) or "none"
        raise ImportError(
            f"trainkit train runs the trainer registered as {name!r} in the {TRAINERS!r} "
            f"entry points, and it is not installed (installed: {installed}); "
            "`pip install trainkit-trainer` installs it"
        )
    return plugins.load(TRAINERS, name)


def trainer_config_class(name: str = DEFAULT_TRAINER) -> Any:
    """The dataclass the trainer is built from (its ``config_class``)."""
    config_class = getattr(trainer_class(name), "config_class", None)
    if config_class is None:
        raise TypeError(
            f"the trainer registered as {name!r} declares no config_class; trainkit train "
            "builds a trainer from its config dataclass (class T(Configurable, config=C))"
        )
    return config_class
