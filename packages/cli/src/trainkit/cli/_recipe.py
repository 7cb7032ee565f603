"""A config's ``recipe: NAME``: the sections of a registered recipe merged into the config.

The recipe's algorithms come first, then the config's own; an algorithm the config lists
itself replaces the recipe's entry of the same name (so its fields can be changed). Every
other section the recipe sets (``schedulers``, ``optimizers``) is used only where the
config does not set that section; a note says when the config's own wins.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from trainkit.cli._schema import Problem
from trainkit.core import plugins

__all__ = ["GROUP", "RECIPE", "expand_recipe", "recipe_sections"]

RECIPE = "recipe"
"""The config's top-level key naming a recipe."""
GROUP = "trainkit.recipes"
"""The entry-point group recipes are registered in (trainkit-algorithms registers its own)."""


def recipe_sections(name: str) -> dict[str, Any]:
    """The sections recipe ``name`` sets, as config data.

    Raises:
        ValueError: no recipe of that name is installed, or its entry point is not a recipe.
    """
    known = plugins.available(GROUP)
    if name not in known:
        hint = plugins.did_you_mean(name, known)
        installed = (
            f"installed: {', '.join(known)}"
            if known
            else "none is installed (pip install trainkit-algorithms)"
        )
        raise ValueError(f"no recipe named {name!r}{hint}; {installed}")
    recipe = plugins.load(GROUP, name)
    sections = getattr(recipe, "sections", None)  # the entry point may be any Recipe-like
    if not isinstance(sections, Mapping):
        raise ValueError(
            f"the {GROUP!r} entry point {name!r} is a {type(recipe).__name__}, not a recipe: "
            "it must have a 'sections' mapping (see trainkit.algorithms.recipes.Recipe)"
        )
    return copy.deepcopy(dict(sections))


def expand_recipe(
    raw: Mapping[str, Any], problems: list[Problem], notes: list[str]
) -> dict[str, Any]:
    """``raw`` without its ``recipe`` key, the recipe's sections merged in."""
    merged = {k: v for k, v in raw.items() if k != RECIPE}
    name = raw.get(RECIPE)
    if name is None:
        return merged
    if not isinstance(name, str):
        problems.append(Problem(RECIPE, f"must be a recipe's name, e.g. lm_fast; got {name!r}"))
        return merged
    try:
        sections = recipe_sections(name)
    except ValueError as err:
        problems.append(Problem(RECIPE, str(err)))
        return merged
    added: list[str] = []
    kept: list[str] = []
    for key, value in sections.items():
        if key == "algorithms":
            own = merged.get(key)
            own = [] if own is None else own if isinstance(own, list) else [own]
            own_names = {_name(entry) for entry in own}
            mine = [entry for entry in value if _name(entry) not in own_names]
            merged[key] = [*mine, *own]
            added += [_name(entry) for entry in mine]
        elif merged.get(key) is not None:
            kept.append(key)
        else:
            merged[key] = value
            entries = value if isinstance(value, list) else [value]
            added += [f"{key[:-1]} {_name(entry)}" for entry in entries]
    notes.append(f"recipe {name}: {', '.join(added) or 'nothing the config does not set'}")
    if kept:
        notes.append(f"recipe {name}: the config's own {' and '.join(kept)} used, not the recipe's")
    return merged


def _name(entry: Any) -> str:
    if isinstance(entry, Mapping):
        return str(entry.get("name"))
    return str(entry)
