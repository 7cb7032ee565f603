"""`State`: everything a training step needs, in one place, and how to save it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import InitVar, dataclass, field
from typing import Any

import torch
from torch import nn

from trainkit.core import dist
from trainkit.core._callback import Algorithm, Stateful
from trainkit.core._data import DataSpec
from trainkit.core._parallel import ParallelStrategy, SingleProcess
from trainkit.core._precision import Precision
from trainkit.core._preemption import PreemptionRequest
from trainkit.core._rng import get_rng_state, set_rng_state
from trainkit.core._time import Time, Timestamp, TimeUnit
from trainkit.core.messages import warn

__all__ = ["Evaluator", "State", "check_microbatch_size_value", "check_subset_num_batches"]


@dataclass(kw_only=True)
class Evaluator:
    """An evaluation data set, the metrics to compute on it, and when.

    Args:
        label: name used in logged metric keys (``metrics/<label>/<metric>``).
        data: the eval batches: a `DataSpec`, a `DataLoader` or any re-iterable of batches
            (Composer's ``dataloader=``).
        metric_names: which of the model's eval metrics to compute (default: all).
        subset_num_batches: evaluate on the first this many batches only (None or -1: all;
            default: the Trainer's ``eval_subset_num_batches``).
        eval_interval: when this evaluator runs during ``fit``, as the Trainer's
            ``eval_interval`` (default: that one).
        device_eval_microbatch_size: evaluate each batch in microbatches of this many
            samples (an int), or ``"auto"``: whole batches until one runs out of memory,
            then half the size, agreed across ranks and kept for the batches after.
            Default: the Trainer's ``device_eval_microbatch_size`` (None: whole batches).
    """

    label: str
    data: DataSpec = None  # type: ignore[assignment]  # required; checked by __post_init__
    metric_names: Sequence[str] | None = None
    subset_num_batches: int | None = None
    eval_interval: Any = None
    device_eval_microbatch_size: int | str | None = None
    auto_microbatching: bool = field(default=False, init=False)
    """Whether ``device_eval_microbatch_size`` halves on out-of-memory (given as
    ``"auto"``); the size it has come to is then ``device_eval_microbatch_size`` (None:
    whole batches so far)."""
    dataloader: InitVar[Any] = None
    """Composer's name for ``data``: refused with a message that names ``data``."""

    def __post_init__(self, dataloader: Any) -> None:
        if self.data is None:
            composer = " (Composer's dataloader=...)" if dataloader is not None else ""
            raise TypeError(
                f"Evaluator {self.label!r} needs data=...{composer}: a DataSpec, a DataLoader "
                f"or any re-iterable of batches, e.g. Evaluator(label={self.label!r}, data=loader)"
            )
        self.data = DataSpec.coerce(self.data, f"evaluator {self.label!r} data")
        self.subset_num_batches = check_subset_num_batches(
            self.subset_num_batches, f"evaluator {self.label!r} subset_num_batches"
        )
        self.set_microbatch_size(self.device_eval_microbatch_size)

    def set_microbatch_size(self, value: int | str | None) -> None:
        """Set ``device_eval_microbatch_size`` (a positive int, ``"auto"`` or None)."""
        size, auto = check_microbatch_size_value(
            value, f"evaluator {self.label!r} device_eval_microbatch_size"
        )
        self.device_eval_microbatch_size, self.auto_microbatching = size, auto


def check_microbatch_size_value(value: Any, what: str) -> tuple[int | None, bool]:
    """``(size, auto)`` for a ``device_*_microbatch_size`` named ``what``: a positive int,
    ``"auto"`` or None (whole batches)."""
    if value is None:
        return None, False
    if value == "auto":
        return None, True
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(
            f"{what} {value!r} is not valid; use a positive int, 'auto' (halve on "
            "out-of-memory), or None (whole batches)"
        )
    return value, False


def check_subset_num_batches(value: Any, what: str) -> int | None:
    """None or -1 (Composer's spelling) mean all batches; else a positive int."""
    if value is None or (type(value) is int and value == -1):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(
            f"{what} must be a positive number of batches, or None / -1 for all, got {value!r}"
        )
    return value


@dataclass(eq=False, kw_only=True)
class State:
    """The run's state. Algorithms and callbacks read and change it at each event.

    Everything needed to resume exactly is in `state_dict`: model, optimizers, schedulers,
    precision (its grad scaler), timestamp, RNG states of every rank, data position, metrics, and the
    state of every algorithm and callback that has one. The tensors it returns are the
    live ones: copy (or save) them before training goes on.
    """

    model: nn.Module
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    step_schedulers_every_batch: bool = True
    """Whether `finish_batch` steps the schedulers (True) or `finish_epoch` does (False);
    set by `prepare_run` from the Trainer's ``step_schedulers_every_batch``."""
    train_data: DataSpec | None = None
    evaluators: list[Evaluator] = field(default_factory=list)
    max_duration: Time | None = None
    precision: Precision = field(default_factory=Precision)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    seed: int = 0
    device_train_microbatch_size: int | None = None
    auto_microbatching: bool = False
    parallelism: ParallelStrategy = field(default_factory=SingleProcess)
    train_subset_num_batches: int | None = None
    """End every training epoch after this many batches (None: the whole loader)."""
    data_parallel_size: int = 1
    """How many ranks read distinct data (from the strategy, set once by `prepare_run`)."""
    run_name: str = "run"
    algorithms: list[Algorithm] = field(default_factory=list)
    callbacks: list[Any] = field(default_factory=list)
    timestamp: Timestamp = field(default_factory=Timestamp)
    eval_timestamp: Timestamp = field(default_factory=Timestamp)
    """The running evaluator's progress on this rank: zero at its EVAL_START, one batch
    more at each EVAL_BATCH_END, with the samples and tokens counted in the metrics (a
    sample that a `DistributedSampler` repeated is not). Not saved in checkpoints."""
    predict_timestamp: Timestamp = field(default_factory=Timestamp)
    """`Trainer.predict`'s progress, counted as ``eval_timestamp``, from PREDICT_START."""
    train_metrics: dict[str, Any] = field(default_factory=dict)
    eval_metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    dataloader_label: str = "train"
    """Which data the loop reads now: ``"train"``, or the label of the evaluator running."""
    # Set per (micro)batch by the loop.
    batch: Any = None
    outputs: Any = None
    loss: torch.Tensor | None = None
    total_loss: torch.Tensor | None = None
    """The step's loss, from AFTER_TRAIN_BATCH: the mean over the batch's microbatches
    and over the data-parallel ranks (the same on every rank), weighted as the gradient."""
    rank_loss: torch.Tensor | None = None
    """This rank's part of ``total_loss``: the mean loss of its own batch (``total_loss``
    itself on one rank). Non-finite losses are checked on it, to name the rank."""
    preemption: PreemptionRequest | None = None
    """Set by ``fit`` after the batch at which every rank agreed to stop because of a
    preemption signal (None otherwise): a checkpointer saves at that ``BATCH_CHECKPOINT``."""
    resumed_from: str | None = None
    """The checkpoint the run's state was loaded from at BEFORE_LOAD (a path or URL), set by
    whoever loaded it (trainkit-checkpoint's `Checkpointer`); None: the run started afresh.
    The Trainer says where it resumed (or that the run was already complete) from it."""
    loop_private: Any = None
    """What the loop running this State keeps for itself from batch to batch (trainkit-
    trainer's: its recompile counter and out-of-memory checkpoints). Components never read
    it; a hand-written loop may keep anything here, or nothing."""
    replay_step: Callable[[], torch.Tensor] | None = None
    """Runs the current batch's forward and backward again (every microbatch, with their
    events) and returns the loss; set by the loop that runs the step (trainkit-trainer's
    `prepare_run`). Methods that replay the step (SAM) call it; None: the loop offers none."""
    wall_mark: float | None = None
    """``time.perf_counter()`` from which the next batch's wall-clock time counts. ``fit``
    sets it when its loop starts, `finish_batch` moves it to each batch's end, evaluation
    moves it on by the time it took, and ``fit`` clears it when it ends. So, as in Composer,
    a batch's time includes loading it and the previous batch's events and checkpoint, not
    evaluation. None (a hand-written loop that does not set it): from `start_batch`."""
    _stop_requested: bool = False

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def world_size(self) -> int:
        return dist.get_world_size()

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The only optimizer (raises if there are several)."""
        if len(self.optimizers) != 1:
            raise ValueError(f"the run has {len(self.optimizers)} optimizers; use state.optimizers")
        return self.optimizers[0]

    @property
    def dataloader_len(self) -> int | None:
        """Batches per training epoch (at most ``train_subset_num_batches``), when known."""
        length = self.train_data.length if self.train_data is not None else None
        subset = self.train_subset_num_batches
        if subset is None:
            return length
        return subset if length is None else min(length, subset)

    def stop_training(self) -> None:
        """Stop after the current batch (its end-of-batch events and checkpoints still run)."""
        self._stop_requested = True

    def clear_stop(self) -> None:
        """Forget a stop request (each ``fit`` starts with none)."""
        self._stop_requested = False

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    def elapsed_fraction(self) -> float:
        """How far training is through ``max_duration`` (0.0 to 1.0 and beyond)."""
        if self.max_duration is None:
            raise ValueError("the run has no max_duration, so no elapsed fraction")
        unit, total = self.max_duration.unit, self.max_duration.value
        if total == 0:
            return 1.0
        if unit == TimeUnit.EPOCH:
            length = self.dataloader_len
            partial = self.timestamp.batch_in_epoch / length if length else 0.0
            return (self.timestamp.epoch + partial) / total
        return self.timestamp.get(unit) / total

    def is_done(self) -> bool:
        duration = self.max_duration
        if duration is None:
            return False
        if duration.unit is TimeUnit.BATCH:  # the common case, asked twice per batch
            return self.timestamp.batch >= duration.value
        return self.elapsed_fraction() >= 1.0 - 1e-12

    # --- saving and resuming -------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume. Collective: every rank must call it."""
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        state: dict[str, Any] = {
            "model": get_model_state_dict(self.model),
            "optimizers": [get_optimizer_state_dict(self.model, opt) for opt in self.optimizers],
            "schedulers": [s.state_dict() for s in self.schedulers],
            "timestamp": self.timestamp.state_dict(),
            "rng": dist.all_gather_object(get_rng_state()),
            "run_name": self.run_name,
            "seed": self.seed,
            "train_metrics": {k: _metric_state(m) for k, m in self.train_metrics.items()},
            "algorithms": _states_by_name(self.algorithms),
            "callbacks": _states_by_name(self.callbacks),
        }
        if precision_state := self.precision.state_dict():
            state["precision"] = precision_state
        if self.train_data is not None:
            state["data"] = self.train_data.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Restore what `state_dict` returned. Entries missing from ``state`` are left as they are."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        _check_count("optimizers", self.optimizers, state.get("optimizers"))
        _check_count("schedulers", self.schedulers, state.get("schedulers"))
        if "model" in state:
            set_model_state_dict(
                self.model, state["model"], options=StateDictOptions(strict=strict)
            )
        for opt, opt_state in zip(self.optimizers, state.get("optimizers", ()), strict=False):
            set_optimizer_state_dict(self.model, opt, opt_state)
        for sched, sched_state in zip(self.schedulers, state.get("schedulers", ()), strict=False):
            sched.load_state_dict(sched_state)
        if "timestamp" in state:
            self.timestamp = Timestamp.from_state_dict(state["timestamp"])
        if "rng" in state:
            self._load_rng(state["rng"])
        if "precision" in state:
            self.precision.load_state_dict(state["precision"])
        if self.train_data is not None and "data" in state:
            self.train_data.load_state_dict(state["data"])
        for name, metric_state in state.get("train_metrics", {}).items():
            if name in self.train_metrics:
                self.train_metrics[name].load_state_dict(metric_state)
        _load_by_name("algorithm", self.algorithms, state.get("algorithms", {}))
        _load_by_name("callback", self.callbacks, state.get("callbacks", {}))

    def _load_rng(self, rng_states: list[dict[str, Any]]) -> None:
        rank = self.rank
        if rank < len(rng_states):
            set_rng_state(rng_states[rank])
            if len(rng_states) != self.world_size:
                warn(
                    f"the saved run had {len(rng_states)} ranks and this one has "
                    f"{self.world_size}: random streams continue only for the ranks both share",
                )
        else:
            warn(
                f"no saved RNG state for rank {rank} (the saved run had {len(rng_states)} "
                "ranks); this rank keeps its freshly seeded generators",
            )


def _metric_state(metric: Any) -> dict[str, Any]:
    # torchmetrics keeps metric states out of state_dict() unless marked persistent.
    if hasattr(metric, "persistent"):
        metric.persistent(True)
    return metric.state_dict()


def _names(objects: Sequence[Any]) -> list[str]:
    names, seen = [], {}
    for obj in objects:
        name = type(obj).__qualname__
        seen[name] = seen.get(name, -1) + 1
        names.append(name if seen[name] == 0 else f"{name}.{seen[name]}")
    return names


def _states_by_name(objects: Sequence[Any]) -> dict[str, Any]:
    states = {}
    for name, obj in zip(_names(objects), objects, strict=True):
        if isinstance(obj, Stateful) and (value := obj.state_dict()):
            states[name] = value
    return states


def _load_by_name(kind: str, objects: Sequence[Any], states: dict[str, Any]) -> None:
    by_name = dict(zip(_names(objects), objects, strict=True))
    for name, value in states.items():
        if name not in by_name:
            warn(
                f"the checkpoint has state for {kind} {name!r}, which this run does not use; "
                f"ignored (this run's {kind}s: {sorted(by_name) or 'none'})",
            )
            continue
        by_name[name].load_state_dict(value)


def _check_count(what: str, live: Sequence[Any], saved: Sequence[Any] | None) -> None:
    if saved is not None and len(saved) != len(live):
        raise ValueError(
            f"the saved state has {len(saved)} {what} but this run has {len(live)}; "
            f"build the run with the same {what} to resume it"
        )
