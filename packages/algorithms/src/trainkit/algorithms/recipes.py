"""Recipes: compositions of methods measured together, by name.

A recipe is the config sections it adds to a run, in the form a ``trainkit train`` YAML
file gives them: ``recipe: lm_fast`` in a config adds the recipe's algorithms before the
config's own (an algorithm the config lists itself replaces the recipe's entry of the same
name, so its fields can be changed), and fills any other section the recipe sets
(``schedulers``, ``optimizers``) where the config does not set it. Recipes are registered
in the ``trainkit.recipes`` entry-point group; a third-party package publishes its own as
a `Recipe` the same way.

Each recipe's docstring states what it was measured to do, with the command that measures
it (``bench/time_to_quality.py``); ``docs/recipes.md`` has the table for every method.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainkit.core import Algorithm, plugins

__all__ = ["LM_FAST", "Recipe"]


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """Methods that go together, with the measurement that named them.

    Example, without the CLI::

        from trainkit.algorithms.recipes import LM_FAST

        trainer = Trainer(model=..., algorithms=LM_FAST.build("algorithms"),
                          schedulers=LM_FAST.build("schedulers"), ...)
    """

    name: str
    """The recipe's name in configs (``recipe: <name>``) and its entry point's name."""
    summary: str
    """What it is for, in one line."""
    algorithms: tuple[Mapping[str, Any], ...] = ()
    """Config entries of the ``trainkit.algorithms`` it adds: ``{"name": ..., <field>: ...}``."""
    schedulers: tuple[Mapping[str, Any], ...] | None = None
    """Config entries of the ``trainkit.schedulers`` it sets, or None to leave the run's."""
    optimizers: Mapping[str, Any] | None = None
    """The ``trainkit.optimizers`` config entry it sets, or None to leave the run's."""
    measured: str = field(default="", compare=False)
    """What the bench measured it to do, and the command."""

    def __post_init__(self) -> None:
        entries = [*self.algorithms, *(self.schedulers or ()), *filter(None, [self.optimizers])]
        for entry in entries:
            if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
                raise ValueError(
                    f"recipe {self.name!r}: each entry must be a mapping with a 'name', got "
                    f"{entry!r}"
                )

    @property
    def sections(self) -> dict[str, Any]:
        """The config sections the recipe sets, as plain data (a copy)."""
        sections: dict[str, Any] = {"algorithms": [dict(a) for a in self.algorithms]}
        if self.schedulers is not None:
            sections["schedulers"] = [dict(s) for s in self.schedulers]
        if self.optimizers is not None:
            sections["optimizers"] = dict(self.optimizers)
        return copy.deepcopy(sections)

    def build(self, section: str) -> list[Any]:
        """The components of ``section`` ("algorithms" or "schedulers"), each built from
        its registered entry point with the recipe's fields (for a Trainer built in Python).

        Raises:
            ValueError: ``section`` is not one the recipe can build.
            KeyError: a component is not installed (the message names its package's group).
        """
        if section not in ("algorithms", "schedulers"):
            raise ValueError(
                f"Recipe.build builds 'algorithms' or 'schedulers', not {section!r}; the "
                "optimizer needs the model's parameters: build it from recipe.optimizers"
            )
        group = f"trainkit.{section}"
        built = []
        for entry in self.sections.get(section, []):
            options = dict(entry)
            name = options.pop("name")
            if name not in plugins.available(group):
                raise KeyError(
                    f"recipe {self.name!r} needs {name!r} from the {group!r} entry points, "
                    f"which is not installed; installed: {', '.join(plugins.available(group))}"
                )
            built.append(plugins.load(group, name)(**options))
        return built

    def build_algorithms(self) -> list[Algorithm]:
        """The recipe's algorithms, built (``build("algorithms")``)."""
        return self.build("algorithms")


LM_FAST = Recipe(
    name="lm_fast",
    summary="a GPT-2-style language model to a quality sooner on the same hardware",
    algorithms=(
        {"name": "relu_squared"},
        {"name": "rotary"},
        {"name": "batch_size_warmup"},
    ),
    schedulers=({"name": "wsd", "t_warmup": "0.05dur"},),
    measured=(
        "On trainkit train's default task (a 2 x 128 byte-level GPT-2 on Python source, 2 CPU "
        "cores, 230 s of training): reaches the baseline's final held-out bits/byte in 0.474 "
        "of its time (median of 3 seeds, 0.438-0.494) and ends 0.29 bits/byte below it "
        "(1.743 vs 2.036). bench/time_to_quality.py --budget 230 --seeds 3 --variants "
        "baseline,lm_fast. GPU: not measured."
    ),
)
"""ReLU² MLPs, rotary positions, batch-size warmup and a warmup-stable-decay schedule.

On ``trainkit train``'s default task (a 2 x 128 byte-level GPT-2 on Python source, 2 CPU
cores, 230 s of training) it reached the baseline's final held-out bits/byte in 0.474 of
the baseline's time (median of 3 seeds; 0.438 to 0.494) and ended at 1.743 bits/byte
against the baseline's 2.036. Without batch-size warmup the same composition needed 0.556
(0.453 to 0.730). Measured with ``bench/time_to_quality.py``; the table and the dated
figures: ``docs/recipes.md``, ``bench/results/``. It is for GPT-2-style models: rotary
replaces their learned positions, and refuses Llama-style models, which rotate already.
"""
