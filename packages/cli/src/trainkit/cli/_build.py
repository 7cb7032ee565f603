"""Turning a validated `RunConfig` into a `TrainerConfig` (and the checkpointer it holds)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainkit.cli._config import (
    DATA,
    OPTIMIZER_GROUP,
    TRAINER,
    Component,
    ConfigError,
    RunConfig,
    sections,
)
from trainkit.cli._schema import Problem, build_checked, check_dataclass
from trainkit.cli._trainer import trainer_config_class
from trainkit.core import TrainModel

__all__ = ["Run", "build_run"]

MODEL = "model"  # the TrainerConfig slot the optimizers are built on


@dataclass
class Run:
    """What `build_run` made."""

    config: Any
    """The Trainer's config, every slot filled from the file."""
    checkpointer: Any | None
    """The checkpointer (also among ``config.callbacks``), or None."""


def build_run(config: RunConfig, meta_model: bool = False) -> Run:
    """Build every component of ``config`` (the model first) and the `TrainerConfig`; with
    ``meta_model`` the model on the meta device (nothing allocated: `trainkit plan`)."""
    filled: dict[str, Any] = {}
    for section in sections():
        value = config.components[section.key]
        if value is None or value == []:
            continue
        if section.key == DATA:
            filled.update(_data(value, section.fills))
            continue
        if section.group == OPTIMIZER_GROUP:
            model = filled[MODEL]
            optimizers = [_build(c, _parameters(c, model)) for c in _listed(value)]
            filled[section.fills[0]] = optimizers if isinstance(value, list) else optimizers[0]
        elif isinstance(value, list):
            filled[section.fills[0]] = [_build(c) for c in value]
        elif section.fills[0] == MODEL and meta_model:
            with torch.device("meta"):
                filled[MODEL] = _build(value)
        else:
            filled[section.fills[0]] = _build(value)
        if section.fills[0] == MODEL:
            _check_model(value, filled[MODEL])
    checkpointer = None
    if config.checkpoint is not None:
        checkpointer = _build(config.checkpoint)
        callbacks = _callbacks_slot()
        filled[callbacks] = [*filled.get(callbacks, []), checkpointer]
    trainer_config, problems = check_dataclass(
        trainer_config_class(), config.trainer, TRAINER, filled
    )
    _raise(problems)
    return Run(trainer_config, checkpointer)


def _listed(value: Component | list[Component]) -> list[Component]:
    return value if isinstance(value, list) else [value]


def _parameters(component: Component, model: nn.Module) -> list[Any]:
    """What an optimizer is built on: ``model.parameters()``, or ``model.named_parameters()``
    for one whose first argument is named ``named_params`` (it tells parameters apart by
    name, as ``muon`` does)."""
    try:
        first = next(iter(inspect.signature(component.target).parameters), None)
    except (TypeError, ValueError):
        first = None
    if first == "named_params":
        return list(model.named_parameters())
    return list(model.parameters())


def _check_model(component: Component, model: Any) -> None:
    """A model the loop can train: a module that computes its own loss (`TrainModel`)."""
    loss = getattr(type(model), "loss", None)
    if isinstance(model, nn.Module) and callable(loss) and loss is not TrainModel.loss:
        return
    what = f"a {type(model).__name__}"
    if isinstance(model, nn.Module):
        what += " (a torch module without a loss(outputs, batch) method)"
    raise ConfigError(
        f"{MODEL} ({component.name}) returned {what}, but the Trainer needs a model that "
        "computes its own loss: return a trainkit.core.TrainModel that implements "
        "loss(outputs, batch), or wrap the network in one of trainkit-trainer's models, "
        "Classifier(network, num_classes=...) for classification or "
        "HuggingFaceModel(transformers_model) (the 'huggingface' model, for a transformers "
        "config), from the factory."
    )


def _callbacks_slot() -> str:
    (section,) = [s for s in sections() if s.group == "trainkit.callbacks"]
    return section.fills[0]


def _build(component: Component, *leading: Any) -> Any:
    if leading:  # an optimizer: its own checks name the argument at fault
        built, problems = build_checked(
            lambda **options: component.target(*leading, **options),
            component.options,
            component.path,
            f"{component.name}: ",
        )
        _raise(problems)
        return built
    try:
        return component.build()
    except ValueError as err:
        raise ConfigError(f"{component.path} ({component.name}): {err}") from err


def _data(component: Component, slot_names: tuple[str, ...]) -> dict[str, Any]:
    loaders = _build(component)
    keys = {name.removesuffix("_dataloader"): name for name in slot_names}
    first = next(iter(keys))
    if not isinstance(loaders, dict) or first not in loaders:
        raise ConfigError(
            f"{DATA} ({component.name}) must return a dict with {first!r} (and optionally "
            f"{', '.join(map(repr, list(keys)[1:]))}) loaders, got {type(loaders).__name__}"
        )
    unknown = sorted(set(loaders) - set(keys))
    if unknown:
        raise ConfigError(
            f"{DATA} ({component.name}) returned loaders {unknown}; the Trainer takes "
            f"{', '.join(map(repr, keys))}"
        )
    return {keys[key]: loader for key, loader in loaders.items()}


def _raise(problems: list[Problem]) -> None:
    if problems:
        raise ConfigError("\n".join(f"{p.path}: {p.message}" for p in problems), problems)
