"""Turning a validated `RunConfig` into the objects a `Trainer` takes."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

import torch

from trainkit.cli._config import Component, ConfigError, OptimizerConfig, RunConfig
from trainkit.core import plugins, schedulers

__all__ = ["build_components", "resolve"]

_SCHEDULERS = {
    "constant": schedulers.ConstantScheduler,
    "linear": schedulers.LinearScheduler,
    "linear_with_warmup": schedulers.LinearWithWarmupScheduler,
    "cosine": schedulers.CosineAnnealingScheduler,
    "cosine_with_warmup": schedulers.CosineAnnealingWithWarmupScheduler,
    "multistep": schedulers.MultiStepScheduler,
    "exponential": schedulers.ExponentialScheduler,
    "polynomial": schedulers.PolynomialScheduler,
    "step": schedulers.StepScheduler,
}


def resolve(group: str, name: str) -> Any:
    """An entry point by name, or ``module:attribute``."""
    if ":" in name:
        module, _, attribute = name.partition(":")
        try:
            return getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as err:
            raise ConfigError(f"cannot import {name!r}: {err}") from err
    return plugins.load(group, name)


def instantiate(group: str, component: Component, where: str, **extra: Any) -> Any:
    factory = resolve(group, component.name)
    kwargs = {**component.kwargs, **extra}
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as err:
        accepted = _parameters(factory)
        raise ConfigError(
            f"{where} ({component.name}): {err}; accepted fields: {accepted}"
        ) from None
    return factory(**kwargs)


def _parameters(factory: Any) -> str:
    try:
        names = [
            p.name
            for p in inspect.signature(factory).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return "unknown"
    return ", ".join(names) or "none"


def build_optimizer(config: OptimizerConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    cls = (
        resolve("", config.name) if ":" in config.name else getattr(torch.optim, config.name, None)
    )
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        known = sorted(
            n
            for n, v in vars(torch.optim).items()
            if isinstance(v, type) and issubclass(v, torch.optim.Optimizer) and n != "Optimizer"
        )
        raise ConfigError(
            f"optimizer.name: {config.name!r} is not a torch optimizer; use one of {', '.join(known)} or module:Class"
        )
    kwargs = dict(config.model_extra or {})
    try:
        return cls(model.parameters(), lr=config.lr, **kwargs)
    except TypeError as err:
        raise ConfigError(
            f"optimizer ({config.name}): {err}; accepted fields: {_parameters(cls)}"
        ) from None


def build_scheduler(component: Component, index: int) -> Any:
    factory = _SCHEDULERS.get(component.name)
    if factory is None and ":" not in component.name:
        raise ConfigError(
            f"schedulers.{index}.name: unknown schedule {component.name!r}; use one of {', '.join(_SCHEDULERS)} or module:factory"
        )
    factory = factory or resolve("", component.name)
    try:
        return factory(**component.kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"schedulers.{index} ({component.name}): {err}; accepted fields: {_parameters(factory)}"
        ) from None


def build_components(config: RunConfig, run_dir: Path) -> dict[str, Any]:
    """Keyword arguments for `Trainer`, built from ``config``."""
    model = instantiate("trainkit.models", config.model, "model")
    data = instantiate("trainkit.data", config.data, "data")
    if not isinstance(data, dict) or "train" not in data:
        raise ConfigError(
            f"data ({config.data.name}) must return a dict with 'train' (and optionally 'eval') loaders, got {type(data).__name__}"
        )
    callbacks = [
        instantiate("trainkit.callbacks", c, f"callbacks.{i}")
        for i, c in enumerate(config.callbacks)
    ]
    if config.checkpoint is not None and "checkpointer" in plugins.available("trainkit.callbacks"):
        checkpoint = config.checkpoint.model_dump()
        checkpointer = plugins.load("trainkit.callbacks", "checkpointer")
        callbacks.append(checkpointer(run_dir / "checkpoints", **checkpoint))
    loggers = [
        instantiate("trainkit.loggers", c, f"loggers.{i}") for i, c in enumerate(config.loggers)
    ]
    if "file" in plugins.available("trainkit.loggers") and not any(
        c.name == "file" for c in config.loggers
    ):
        loggers.append(plugins.load("trainkit.loggers", "file")(folder=run_dir))
    trainer = config.trainer
    return {
        "model": model,
        "train_dataloader": data["train"],
        "eval_dataloader": data.get("eval"),
        "optimizers": build_optimizer(config.optimizer, model),
        "schedulers": [build_scheduler(s, i) for i, s in enumerate(config.schedulers)],
        "algorithms": [
            instantiate("trainkit.algorithms", a, f"algorithms.{i}")
            for i, a in enumerate(config.algorithms)
        ],
        "callbacks": callbacks,
        "loggers": loggers,
        "parallelism": instantiate("trainkit.parallel", config.parallelism, "parallelism")
        if config.parallelism
        else None,
        "max_duration": trainer.max_duration,
        "eval_interval": trainer.eval_interval,
        "precision": trainer.precision,
        "device": trainer.device,
        "device_train_microbatch_size": trainer.device_train_microbatch_size,
        "seed": trainer.seed,
        "deterministic": trainer.deterministic,
        "progress_bar": trainer.progress_bar,
        "run_name": config.run_name or run_dir.name,
    }
