"""Turning the Trainer's flexible arguments into checked, concrete objects."""

from __future__ import annotations

import inspect
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from trainkit.core import (
    DataSpec,
    Evaluator,
    LoggerDestination,
    State,
    Time,
    TimeUnit,
    TrainModel,
    dist,
    plugins,
)
from trainkit.core.data import check_microbatch_size_value
from trainkit.core.progress import ProgressLines
from trainkit.trainer.schedulers import Scheduler

__all__ = [
    "check_microbatch_size",
    "check_model",
    "make_evaluators",
    "make_optimizers",
    "make_schedulers",
    "progress_destination",
    "scale_max_duration",
    "step_every_batch",
]


def check_model(model: Any) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module (a TrainModel), got {type(model).__name__}"
        )
    loss = getattr(model, "loss", None)
    if not callable(loss) or getattr(type(model), "loss", None) is TrainModel.loss:
        raise TypeError(
            f"model {type(model).__name__} has no loss(outputs, batch) method; subclass "
            "trainkit.core.TrainModel and implement it, or wrap the network in "
            "Classifier(...) / HuggingFaceModel(...)"
        )


def check_microbatch_size(value: Any, data: DataSpec | None) -> tuple[int | None, bool]:
    """Returns (size, auto); a size must fit in the loader's batch size."""
    size, auto = check_microbatch_size_value(value, "device_train_microbatch_size")
    batch_size = getattr(data.dataloader, "batch_size", None) if data is not None else None
    if size is not None and isinstance(batch_size, int) and size > batch_size:
        raise ValueError(
            f"device_train_microbatch_size {size} is larger than the batch size {batch_size}; "
            f"use a size from 1 to {batch_size}"
        )
    return size, auto


def make_optimizers(optimizers: Any, model: nn.Module) -> list[torch.optim.Optimizer]:
    listed = [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers)
    model_params = {id(p) for p in model.parameters()}
    for optimizer in listed:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"optimizers must be torch.optim.Optimizer objects, got {type(optimizer).__name__}"
            )
        params = [p for g in optimizer.param_groups for p in g["params"]]
        if not any(id(p) in model_params for p in params):
            raise ValueError(
                f"{type(optimizer).__name__} covers none of the model's {len(model_params)} "
                f"parameters ({len(params)} others); build it from model.parameters() of the "
                "model passed to the Trainer"
            )
    return listed


def make_schedulers(schedulers: Any, state: State, scale_schedule_ratio: float = 1.0) -> list[Any]:
    """Compile trainkit schedules (one `ScheduleLR` per optimizer) and check torch schedulers;
    with ``scale_schedule_ratio`` != 1, torch schedulers are scaled in place (as Composer)."""
    ssr = check_scale_schedule_ratio(scale_schedule_ratio)
    if schedulers is None:
        return []
    # A string is one (wrong) scheduler, not a sequence of them.
    listed = (
        list(schedulers)
        if isinstance(schedulers, Sequence) and not isinstance(schedulers, str)
        else [schedulers]
    )
    compiled: list[Any] = []
    for scheduler in listed:
        if isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
            _scale_torch_scheduler(scheduler, ssr)
            compiled.append(scheduler)
        elif isinstance(scheduler, Scheduler):
            schedule = _with_ratio(scheduler, ssr)
            for optimizer in state.optimizers:
                compiled.append(ScheduleLR(optimizer, _at_state(schedule, state)))
        else:
            raise TypeError(
                f"scheduler {scheduler!r} is neither a trainkit schedule (a callable of the "
                "state) nor a torch.optim.lr_scheduler.LRScheduler"
            )
    return compiled


def make_schedule(
    schedulers: Any, state: State, scale_schedule_ratio: Any, step_schedulers_every_batch: Any
) -> tuple[list[Any], bool]:
    """The run's schedulers built on its optimizers (scaled by ``scale_schedule_ratio``) and
    whether they step every batch: the constructor's, and a ``fit()`` stage's that gives
    schedulers. Everything is checked before anything is built."""
    ratio = check_scale_schedule_ratio(scale_schedule_ratio)
    if ratio != 1.0 and not schedulers:
        raise ValueError(
            f"scale_schedule_ratio {ratio} has no effect without schedulers; "
            "give schedulers or leave it at 1.0"
        )
    every_batch = step_every_batch(schedulers, step_schedulers_every_batch)
    return make_schedulers(schedulers, state, ratio), every_batch


def check_scale_schedule_ratio(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(
            f"scale_schedule_ratio must be a positive number (0.5 trains half as long), got {value!r}"
        )
    return float(value)


def scale_max_duration(max_duration: Time | None, ratio: float) -> Time | None:
    """``max_duration`` times ``scale_schedule_ratio`` (whole epochs, batches, ...)."""
    if max_duration is None or ratio == 1.0:
        return max_duration
    value = max_duration.value * ratio
    scaled = Time(value if max_duration.unit == TimeUnit.SECOND else int(value), max_duration.unit)
    if scaled.value == 0:
        raise ValueError(
            f"scale_schedule_ratio {ratio} reduces max_duration {max_duration} to 0; use a "
            "larger ratio or a longer max_duration"
        )
    return scaled


def step_every_batch(schedulers: Any, step_schedulers_every_batch: bool | None) -> bool:
    """Composer's rule: explicit True/False for all schedulers; by default every batch
    unless a torch LR scheduler is among them, then every epoch (for all of them)."""
    if step_schedulers_every_batch is not None:
        if not isinstance(step_schedulers_every_batch, bool):
            raise ValueError(
                "step_schedulers_every_batch must be True, False or None, got "
                f"{step_schedulers_every_batch!r}"
            )
        return step_schedulers_every_batch
    listed = (
        list(schedulers)
        if isinstance(schedulers, Sequence) and not isinstance(schedulers, str)
        else []
        if schedulers is None
        else [schedulers]
    )
    return not any(isinstance(s, torch.optim.lr_scheduler.LRScheduler) for s in listed)


def _scale_torch_scheduler(scheduler: Any, ratio: float) -> None:
    lr = torch.optim.lr_scheduler
    if ratio == 1.0:
        return
    if isinstance(scheduler, lr.StepLR):
        scheduler.step_size = int(scheduler.step_size * ratio)
    elif isinstance(scheduler, lr.MultiStepLR):
        scheduler.milestones = Counter(int(m * ratio) for m in scheduler.milestones.elements())
    elif isinstance(scheduler, lr.CosineAnnealingLR):
        scheduler.T_max = int(scheduler.T_max * ratio)
    elif isinstance(scheduler, lr.CosineAnnealingWarmRestarts):
        scheduler.T_0 = int(scheduler.T_0 * ratio)
    elif isinstance(scheduler, lr.ExponentialLR):
        scheduler.gamma = scheduler.gamma ** (1 / ratio)
    else:
        raise ValueError(
            f"scale_schedule_ratio cannot scale {type(scheduler).__name__}; it scales StepLR, "
            "MultiStepLR, CosineAnnealingLR, CosineAnnealingWarmRestarts and ExponentialLR, "
            "or use a trainkit schedule"
        )


def _with_ratio(schedule: Any, ratio: float) -> Any:
    if ratio == 1.0:
        return schedule
    try:
        params = inspect.signature(schedule).parameters
    except (TypeError, ValueError):
        params = {}
    if len(params) < 2 and not any(p.kind == p.VAR_POSITIONAL for p in params.values()):
        raise ValueError(
            f"schedule {schedule!r} takes only the state, so scale_schedule_ratio {ratio} "
            "cannot scale it; accept (state, ssr) or use a trainkit schedule"
        )
    return lambda state: schedule(state, ratio)


class ScheduleLR(torch.optim.lr_scheduler.LambdaLR):
    """A trainkit schedule driving one optimizer; `refresh` re-reads it at the current time."""

    def refresh(self) -> None:
        for group, base, schedule in zip(
            self.optimizer.param_groups, self.base_lrs, self.lr_lambdas, strict=True
        ):
            group["lr"] = base * schedule(self.last_epoch)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


def _at_state(schedule: Scheduler, state: State) -> Any:
    # Until the run knows its max_duration (it may come with fit()), keep the base lr.
    return lambda _: schedule(state) if state.max_duration is not None else 1.0


def refresh_schedules(state: State) -> None:
    """Apply each trainkit schedule at the current time (start of fit, after max_duration changes)."""
    for scheduler in state.schedulers:
        if isinstance(scheduler, ScheduleLR):
            scheduler.refresh()


def make_evaluators(eval_data: Any) -> list[Evaluator]:
    if eval_data is None:
        return []
    if isinstance(eval_data, Mapping):
        return [
            Evaluator(label=k, data=DataSpec.coerce(v, f"eval data {k!r}"))
            for k, v in eval_data.items()
        ]
    if isinstance(eval_data, Evaluator):
        return [eval_data]
    if isinstance(eval_data, list | tuple) and all(isinstance(e, Evaluator) for e in eval_data):
        return list(eval_data)
    return [Evaluator(label="eval", data=DataSpec.coerce(eval_data, "eval_dataloader"))]


def eval_metrics_for(
    model: nn.Module, evaluators: Sequence[Evaluator], device: torch.device
) -> dict[str, dict[str, Any]]:
    result = {}
    for evaluator in evaluators:
        metrics = _model_metrics(model, is_train=False)
        if evaluator.metric_names is not None:
            unknown = set(evaluator.metric_names) - set(metrics)
            if unknown:
                raise ValueError(
                    f"evaluator {evaluator.label!r} asks for metrics {sorted(unknown)}, but the "
                    f"model provides {sorted(metrics) or 'none'}"
                )
            metrics = {k: metrics[k] for k in evaluator.metric_names}
        result[evaluator.label] = {k: _to(m, device) for k, m in metrics.items()}
    return result


def _to(metric: Any, device: torch.device) -> Any:
    return metric.to(device) if hasattr(metric, "to") else metric


def train_metrics_for(model: nn.Module, device: torch.device) -> dict[str, Any]:
    return {k: _to(m, device) for k, m in _model_metrics(model, is_train=True).items()}


def _model_metrics(model: nn.Module, is_train: bool) -> dict[str, Any]:
    # A plain nn.Module with forward and loss is a TrainModel without metrics.
    get_metrics = getattr(model, "get_metrics", None)
    return dict(get_metrics(is_train=is_train)) if get_metrics is not None else {}


def progress_destination(data: DataSpec | None) -> LoggerDestination:
    """trainkit-loggers' progress bar when installed (by entry point), else plain lines."""
    if "progress" in plugins.available("trainkit.loggers"):
        return plugins.load("trainkit.loggers", "progress")()
    return ProgressLines()


def console_destination(interval: Any) -> LoggerDestination:
    """trainkit-loggers' console lines every ``interval`` (the Trainer's ``log_to_console``)."""
    if "console" not in plugins.available("trainkit.loggers"):
        raise ImportError(
            "log_to_console=True prints through trainkit-loggers' console destination, and "
            "trainkit-loggers is not installed: `pip install trainkit-loggers` (or leave "
            "log_to_console off; progress_bar=True prints progress lines with core alone)"
        )
    return plugins.load("trainkit.loggers", "console")(interval=interval)


_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def check_python_log_level(level: Any) -> str | None:
    if level is None:
        return None
    if not isinstance(level, str) or level.lower() not in _LOG_LEVELS:
        raise ValueError(
            f"python_log_level {level!r} is not a logging level; use one of {list(_LOG_LEVELS)} "
            "or None"
        )
    return level.lower()


def set_python_log_level(level: str | None) -> None:
    """Set the ``trainkit`` loggers' level; give the program a rank-prefixed handler if it
    has none (as Composer's ``python_log_level``)."""
    if level is None:
        return
    import logging

    if not logging.getLogger().handlers:
        logging.basicConfig(
            format=f"%(asctime)s: rank{dist.get_rank()}[%(process)d][%(threadName)s]: "
            "%(levelname)s: %(name)s: %(message)s"
        )
    logging.getLogger("trainkit").setLevel(level.upper())


def checkpointer_from(config: Any, run_name: str) -> list[Any]:
    """trainkit-checkpoint's Checkpointer built from the Trainer's ``save_*`` / ``load_*`` /
    ``autoresume`` fields (found by entry point), or nothing when none asks for it."""
    if config.save_folder is None and config.load_path is None:
        return []
    if "checkpointer" not in plugins.available("trainkit.callbacks"):
        raise ImportError(
            "save_folder / load_path / autoresume are carried out by trainkit-checkpoint, which "
            "is not installed: `pip install trainkit-checkpoint`"
        )
    checkpointer_class = plugins.load("trainkit.callbacks", "checkpointer")
    given = [c for c in config.callbacks if isinstance(c, checkpointer_class)]
    if given:
        raise ValueError(
            "save_folder / load_path build a Checkpointer, and callbacks already has one; "
            "configure that one instead (or drop it and keep the Trainer's save_* / load_* "
            "arguments)"
        )
    options: dict[str, Any] = {
        "folder": None
        if config.save_folder is None
        else config.save_folder.replace("{run_name}", run_name),
        "interval": config.save_interval,
        "keep": config.save_num_checkpoints_to_keep,
        "overwrite": config.save_overwrite,
        "save_weights_only": config.save_weights_only,
        "autoresume": config.autoresume,
        "load_path": config.load_path,
        "load_weights_only": config.load_weights_only,
        "strict": config.load_strict_model_weights,
        "ignore_keys": config.load_ignore_keys if config.load_ignore_keys is not None else [],
        "exclude_algorithms": list(config.load_exclude_algorithms or ()),
    }
    if config.save_filename is not None:
        options["name_format"] = config.save_filename
    if config.save_upload_to_loggers:
        options["upload_to_loggers"] = True
    return [checkpointer_class(**options)]


def default_run_name() -> str:
    return dist.broadcast_object(time.strftime("run-%Y%m%d-%H%M%S"))


def set_deterministic(device: torch.device) -> None:
    """Deterministic kernels only (the Trainer's ``deterministic``)."""
    if device.type == "cuda":
        # cuBLAS needs this before its first call to be deterministic.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
