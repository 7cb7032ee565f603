"""The ``trainkit train`` config: a YAML file validated with pydantic.

Components are named by entry point (``name: ema``) or by ``module:factory``; every other
key of a component is passed to it as a keyword argument.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainkit.core import ensure_time, plugins

__all__ = ["ConfigError", "RunConfig", "apply_overrides", "load_config"]


class ConfigError(ValueError):
    """The config is not valid; the message lists each problem with its field path."""


class Component(BaseModel):
    """A component by name, with its keyword arguments as the other keys."""

    model_config = ConfigDict(extra="allow")
    name: str

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def _installed_in(group: str) -> Any:
    """A `Component` type whose name must be installed in the entry-point ``group``."""

    def check(component: Component) -> Component:
        _check_name(group, component.name)
        return component

    return Annotated[Component, AfterValidator(check)]


ModelRef = _installed_in("trainkit.models")
DataRef = _installed_in("trainkit.data")
AlgorithmRef = _installed_in("trainkit.algorithms")
CallbackRef = _installed_in("trainkit.callbacks")
LoggerRef = _installed_in("trainkit.loggers")
StrategyRef = _installed_in("trainkit.parallel")


class OptimizerConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field("AdamW", description="a torch.optim class name, or module:Class")
    lr: float = Field(1e-3, gt=0)


class CheckpointConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    interval: str = "500ba"
    keep: int = 3
    autoresume: bool = True
    async_save: bool = False
    load_path: str | None = None
    weights_only: bool = False


class TrainerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_duration: str = "1ep"
    eval_interval: str = "1ep"
    precision: str = "fp32"
    device: str = "auto"
    device_train_microbatch_size: int | str | None = None
    seed: int = 42
    progress_bar: bool = True
    deterministic: bool = False

    @field_validator("max_duration", "eval_interval", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> str:
        ensure_time(value)  # raises ValueError naming the accepted forms
        return str(value)


class RunConfig(BaseModel):
    """What ``trainkit train`` runs."""

    model_config = ConfigDict(extra="forbid")
    run_name: str | None = None
    model: ModelRef = Component(name="tiny_gpt2")
    data: DataRef = Component(name="stdlib_text")
    optimizer: OptimizerConfig = OptimizerConfig()
    schedulers: list[Component] = []
    algorithms: list[AlgorithmRef] = []
    callbacks: list[CallbackRef] = []
    loggers: list[LoggerRef] = []
    parallelism: StrategyRef | None = None
    checkpoint: CheckpointConfig | None = CheckpointConfig()
    trainer: TrainerConfig = TrainerConfig()


def _check_name(group: str, name: str) -> None:
    if ":" in name:
        return  # module:factory, imported when the run is built
    known = plugins.available(group)
    if name not in known:
        raise ValueError(
            f"unknown name {name!r}; installed in {group}: {', '.join(known) or 'none'} (or use 'module:factory')"
        )


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``["trainer.max_duration=2ep", "algorithms.0.alpha=0.2"]`` applied to a copy of ``raw``."""
    result = copy.deepcopy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(
                f"--set {item!r} is not key=value; e.g. --set trainer.max_duration=2ep"
            )
        node: Any = result
        parts = key.split(".")
        for part in parts[:-1]:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        last = parts[-1]
        value = yaml.safe_load(text) if text else ""
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return result


def load_config(
    path: Path | None, overrides: list[str] = (), base: dict[str, Any] | None = None
) -> RunConfig:
    """Read, override and validate a config; ``base`` is used when ``path`` is None."""
    raw: dict[str, Any] = dict(base or {})
    if path is not None:
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict):
            raise ConfigError(
                f"{path} must hold a mapping of sections (model, data, trainer, ...), not a {type(raw).__name__}"
            )
    raw = apply_overrides(_merge(RunConfig().model_dump(exclude_none=True), raw), list(overrides))
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format(err, path)) from None


def _merge(defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``given`` over ``defaults``, section by section (a section's keys merge; lists replace)."""
    merged = dict(defaults)
    for key, value in given.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and "name" not in value:
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def _format(err: ValidationError, path: Path | None) -> str:
    where = str(path) if path else "the default config"
    lines = [f"{where} is not valid:"]
    for problem in err.errors():
        field = ".".join(str(p) for p in problem["loc"])
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            message = "unknown field"
        lines.append(f"  {field}: {message} (got {problem['input']!r})")
    return "\n".join(lines)
