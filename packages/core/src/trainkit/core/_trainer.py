"""The `Trainer`: a short loop; behaviour arrives as algorithms, callbacks and strategies."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainkit.core import _setup as setup
from trainkit.core import dist
from trainkit.core._callback import Algorithm
from trainkit.core._compile import compile_options
from trainkit.core._engine import Engine
from trainkit.core._event import Event
from trainkit.core._fit_guard import FitGuard
from trainkit.core._interval import IntervalTrigger, interval_trigger
from trainkit.core._logger import Logger, LoggerDestination
from trainkit.core._loop import epoch_batches, finish_batch, finish_epoch, prepare_run, start_batch
from trainkit.core._nonfinite import check_nonfinite_mode
from trainkit.core._parallel import ParallelStrategy
from trainkit.core._placement import join_process_group, resolve_parallelism
from trainkit.core._precision import (
    Precision,
    check_device,
    check_precision,
    make_precision,
    resolve_device,
)
from trainkit.core._preemption import check_preemption_signals
from trainkit.core._rng import random_seed, seed_everything
from trainkit.core._state import State, check_subset_num_batches
from trainkit.core._step import eval_forward, evaluate, optimizer_step, train_batch
from trainkit.core._time import Time, Timestamp, TimeUnit, ensure_time
from trainkit.core.config import Configurable, slot, to_plain

__all__ = ["Trainer", "TrainerConfig"]

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class TrainerConfig:
    """Everything a `Trainer` is built from. ``Trainer(**fields)`` builds it for you."""

    model: nn.Module = slot("trainkit.models")
    """The model; it must define ``loss(outputs, batch)`` (a `TrainModel`)."""
    train_dataloader: Any = slot("trainkit.data", default=None)
    """A `DataLoader`, any re-iterable of batches, or a `DataSpec`."""
    max_duration: Time | str | int | None = None
    """How long to train: ``"10ep"``, ``"500ba"``, ``"1e6tok"``, ``"1h"``, an int (epochs),
    or None if every `fit` call gives a ``duration``."""
    optimizers: Any = slot("trainkit.optimizers", default=None)
    """One or more optimizers built on ``model.parameters()``; they keep working after
    algorithms or the strategy replace parameters (re-bound by name). Default: AdamW with
    lr 1e-3, built after algorithms and the strategy have run."""
    schedulers: Any = slot("trainkit.schedulers", default=None)
    """trainkit schedules (`trainkit.core.schedulers`) or torch LR schedulers; when they are
    stepped is ``step_schedulers_every_batch``."""
    step_schedulers_every_batch: bool | None = None
    """True steps every scheduler after each batch, False after each epoch. None (default,
    Composer's rule): after each batch, unless a torch LR scheduler is among ``schedulers``,
    then all of them after each epoch (a torch scheduler's step_size, T_max, ... count
    epochs)."""
    scale_schedule_ratio: float = 1.0
    """Multiplies ``max_duration`` and the schedules' times (milestones, ``t_max``, torch
    schedulers' step_size, T_max, ...; warm-ups only with ``scale_warmup=True``): 0.5 trains
    half as long on the whole schedule. Needs ``schedulers``."""
    algorithms: Sequence[Algorithm] = slot("trainkit.algorithms", default=())
    """Training methods, run by the `Engine` at each `Event`."""
    callbacks: Sequence[Any] = slot("trainkit.callbacks", default=())
    """Observers of the loop, run after the algorithms at each `Event`."""
    loggers: Sequence[LoggerDestination] = slot("trainkit.loggers", default=())
    """Where logged values go."""
    eval_dataloader: Any = slot("trainkit.data", default=None)
    """A loader, a `DataSpec`, an `Evaluator`, a list of `Evaluator`, or a dict
    ``{label: loader}``."""
    eval_interval: Time | str | int | IntervalTrigger = "1ep"
    """A duration (``"1ep"``, ``"500ba"``, ``"0.25dur"``) or a callable
    ``(state, event) -> bool``. Training always ends with an evaluation. An `Evaluator`
    may set its own."""
    eval_subset_num_batches: int | None = None
    """Evaluate on the first this many batches of each eval loader (None or -1: all). An
    `Evaluator` may set its own."""
    train_subset_num_batches: int | None = None
    """End every training epoch after this many batches (None or -1: the whole loader);
    epochs then count these shorter passes."""
    precision: str | Precision | None = "fp32"
    """``"fp32"``, ``"amp_bf16"``, ``"amp_fp16"`` (CUDA, with a grad scaler), or a
    `Precision` object."""
    device: str | torch.device | None = "auto"
    """``"auto"``, ``"cpu"``, ``"cuda"`` (or ``"gpu"``), ``"mps"`` or a `torch.device`."""
    device_train_microbatch_size: int | str | None = None
    """None (whole batch), a size for gradient accumulation, or ``"auto"`` (halve on
    out-of-memory, agreed across ranks)."""
    parallelism: ParallelStrategy | None = slot("trainkit.parallel", default=None)
    """A `ParallelStrategy`. Default: DDP (from trainkit-parallel) at world size > 1, else
    single process; `SingleProcess` at world size > 1 trains independent replicas."""
    seed: int | None = None
    """The run's seed (rank r uses seed + r); random and broadcast if None."""
    deterministic: bool = False
    """Use deterministic kernels only (slower, bitwise reproducible on GPU)."""
    compile: bool | dict[str, Any] = False
    """``torch.compile`` the model: True, or a dict of ``torch.compile`` keyword arguments
    (``{"mode": "max-autotune", "dynamic": True}``). Applied in place after the algorithms'
    surgery (INIT) and the strategy (per block under FSDP and tensor parallel), so parameter
    names and checkpoints are the same as an eager run's; evaluation and prediction use the
    compiled model too. Recompilations after the first batch (new shapes from progressive
    resizing or sequence-length warm-up, evaluation mode) are logged as
    ``compile/recompiles``."""
    progress_bar: bool = True
    """Show progress (trainkit-loggers' bar when installed, else plain lines)."""
    log_to_console: bool = False
    """Print the logged metrics as lines (trainkit-loggers' ``console`` destination), every
    ``console_log_interval``."""
    console_log_interval: Time | str | int = "1ba"
    """How often ``log_to_console`` prints: ``"1ba"``, ``"100ba"``, ``"1ep"``, ... (an int
    counts epochs)."""
    log_traces: bool = False
    """Log which algorithms ran at each event, as ``algorithm_traces/<name>/<event>`` (the
    algorithm's int return value, or 1), to every logger destination."""
    python_log_level: str | None = None
    """Level of the ``trainkit`` Python loggers (``"debug"``, ``"info"``, ``"warning"``,
    ...); a handler that prefixes the rank is installed when the program has none.
    None leaves Python logging as the program set it."""
    run_name: str | None = None
    """Name of the run (default: from the start time)."""
    save_folder: str | None = None
    """Save checkpoints here (a folder or a URL such as ``"s3://bucket/runs/{run_name}"``):
    the Trainer adds trainkit-checkpoint's `Checkpointer`, configured by the ``save_*`` /
    ``load_*`` / ``autoresume`` fields. None: no checkpoints (unless a Checkpointer is
    among ``callbacks``). ``{run_name}`` is filled in."""
    save_filename: str | None = None
    """Name of each checkpoint (a folder holding every rank's shards), with `Timestamp`
    fields, ``{rank}`` and ``{run_name}``; Composer's ``"ep{epoch}-ba{batch}-rank{rank}.pt"``
    is accepted. Default: the Checkpointer's (``"ep{epoch}-ba{batch}"``)."""
    save_interval: Time | str | int | IntervalTrigger = "1ep"
    """How often to save: ``"1ep"``, ``"500ba"``, ``"0.1dur"``, an int (epochs), or a callable
    ``(state, event) -> bool``. The end of training is always saved."""
    save_num_checkpoints_to_keep: int = -1
    """Keep the newest this many checkpoints (-1: all)."""
    save_overwrite: bool = False
    """Replace a checkpoint of the same name; by default saving onto one is an error."""
    save_weights_only: bool = False
    """Save only the model weights (for inference or fine-tuning; such a checkpoint cannot
    resume a run)."""
    save_upload_to_loggers: bool = False
    """Give each checkpoint, once published, to every logger destination as the artifact
    ``checkpoints/<name>`` (wandb: a ``"model"`` artifact; MLflow: the run's artifacts);
    needs a local ``save_folder``. Composer does this through a logger's
    ``log_artifacts=True``; here it is the Checkpointer's ``upload_to_loggers``."""
    load_path: str | None = None
    """Start from this checkpoint: a trainkit checkpoint folder (local or a URL), or a
    Composer ``.pt`` file (read with ``weights_only`` unpickling, never running code)."""
    load_weights_only: bool = False
    """From ``load_path``, load only the model weights."""
    load_strict_model_weights: bool = True
    """Parameter names must match the checkpoint's exactly."""
    load_ignore_keys: list[str] | Callable[[dict[str, Any]], None] | None = None
    """Entries of ``load_path`` not to load: glob patterns (``"model/head.*"``, ``"rng"``) or,
    from Python, a function that edits the loaded state dict in place."""
    load_exclude_algorithms: list[str] | None = None
    """Algorithms (class names) whose saved state is not loaded from ``load_path`` and whose
    presence is not required (e.g. to fine-tune without a surgery method)."""
    autoresume: bool = False
    """Resume from the newest complete checkpoint in ``save_folder`` when there is one
    (then ``load_path`` is ignored), else start as configured; for runs that are restarted
    after a crash or a preemption."""
    preemption_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGINT"])
    """Signals that preempt ``fit``: every rank finishes its batch, all stop after the same
    one, a checkpoint is saved (with ``save_folder``), loggers flush, and ``fit`` raises
    `TrainingPreempted`, a `SystemExit` with status 75 (``EX_TEMPFAIL``). A second signal
    is logged and ignored. Installed by ``fit`` in the main thread only, restored after it;
    ``[]`` leaves signals alone (SIGINT then raises KeyboardInterrupt as usual)."""
    preemption_grace_period: float | None = None
    """Seconds from a preemption signal by which the checkpoint must be published; a save
    still running then is abandoned, and the previous checkpoint stays the latest. Set it a
    few seconds below the cluster's (e.g. 25 for Kubernetes' default 30). None: no limit."""
    on_nonfinite_loss: str = "error"
    """What a NaN or infinite training loss does: ``"error"`` stops ``fit`` with
    `NonFiniteLossError` naming the batch, ``"warn"`` warns once and trains on. Checked
    without waiting for the device: on one CPU process before the batch is checkpointed,
    on CUDA or several ranks a batch or two later (docs/architecture.md)."""

    def __post_init__(self) -> None:
        # What can be checked without the model, data or devices: a config file's mistakes
        # surface when it is read, naming the field.
        _check_max_duration(self.max_duration)
        interval_trigger(self.eval_interval)
        check_precision(self.precision)
        check_device(self.device)
        setup.check_microbatch_size(self.device_train_microbatch_size, None)
        setup.check_scale_schedule_ratio(self.scale_schedule_ratio)
        compile_options(self.compile)
        self.eval_subset_num_batches = check_subset_num_batches(
            self.eval_subset_num_batches, "eval_subset_num_batches"
        )
        self.train_subset_num_batches = check_subset_num_batches(
            self.train_subset_num_batches, "train_subset_num_batches"
        )
        interval_trigger(self.console_log_interval)
        setup.check_python_log_level(self.python_log_level)
        check_preemption_signals(self.preemption_signals)
        _check_grace_period(self.preemption_grace_period)
        check_nonfinite_mode(self.on_nonfinite_loss)
        if self.autoresume and self.save_folder is None:
            raise ValueError(
                "autoresume=True needs save_folder: it resumes from the newest checkpoint there"
            )
        if self.save_upload_to_loggers and self.save_folder is None:
            raise ValueError(
                "save_upload_to_loggers=True needs save_folder: it uploads the checkpoints "
                "saved there; give a local folder, e.g. 'runs/{run_name}/checkpoints'"
            )


class Trainer(Configurable, config=TrainerConfig):
    """Trains a `TrainModel`, as its `TrainerConfig` says.

    ``Trainer(model=..., train_dataloader=..., max_duration="10ep")`` and
    ``Trainer(TrainerConfig(...))`` are the same; see `TrainerConfig` for every field.
    """

    config: TrainerConfig

    def __init__(self, config: TrainerConfig | None = None, /, **options: Any):
        super().__init__(config, **options)
        config = self.config
        model = config.model
        setup.check_model(model)
        join_process_group(config.parallelism, config.device)  # before seed and device
        setup.set_python_log_level(config.python_log_level)
        parallelism = resolve_parallelism(config.parallelism, model)
        device = resolve_device(config.device, dist.get_local_rank())
        precision = make_precision(config.precision, device)
        train_data = (
            setup.to_dataspec(config.train_dataloader, "train_dataloader")
            if config.train_dataloader is not None
            else None
        )
        microbatch, auto = setup.check_microbatch_size(
            config.device_train_microbatch_size, train_data
        )
        duration = _check_max_duration(config.max_duration)
        seed = dist.broadcast_object(random_seed()) if config.seed is None else config.seed
        seed_everything(seed + dist.get_rank())
        if config.deterministic:
            _set_deterministic(device)
        evaluators = setup.make_evaluators(config.eval_dataloader)
        if config.eval_subset_num_batches is not None and not evaluators:
            raise ValueError(
                f"eval_subset_num_batches={config.eval_subset_num_batches} without "
                "eval_dataloader has nothing to limit; give eval_dataloader or leave it unset"
            )
        for evaluator in evaluators:
            if evaluator.subset_num_batches is None:
                evaluator.subset_num_batches = config.eval_subset_num_batches
        self._eval_triggers = [
            (e, interval_trigger(e.eval_interval or config.eval_interval)) for e in evaluators
        ]
        destinations = list(config.loggers)
        if config.progress_bar:
            destinations.append(setup.progress_destination(train_data))
        if config.log_to_console:
            destinations.append(setup.console_destination(config.console_log_interval))

        optimizers = (
            setup.make_optimizers(config.optimizers, model) if config.optimizers is not None else []
        )
        run_name = config.run_name or setup.default_run_name()
        self.state = state = State(
            model=model.to(device),
            optimizers=optimizers,
            train_data=train_data,
            evaluators=evaluators,
            max_duration=duration,
            precision=precision,
            device=device,
            seed=seed,
            device_train_microbatch_size=microbatch,
            auto_microbatching=auto,
            parallelism=parallelism,
            run_name=run_name,
            algorithms=list(config.algorithms),
            callbacks=[*config.callbacks, *setup.checkpointer_from(config, run_name)],
            train_subset_num_batches=config.train_subset_num_batches,
        )
        self.logger = Logger(destinations, state)
        self.engine = Engine(state, self.logger)
        self.engine.log_traces = config.log_traces
        prepare_run(
            state,
            self.engine,
            schedulers=config.schedulers,
            scale_schedule_ratio=config.scale_schedule_ratio,
            step_schedulers_every_batch=config.step_schedulers_every_batch,
            compile=config.compile,
        )
        self.logger.log_hyperparameters(self.hyperparameters())  # destinations started at INIT
        log.info(
            "run %s: %d rank(s), device %s, precision %s, %s, %d algorithm(s), %d callback(s)",
            state.run_name,
            state.world_size,
            device,
            state.precision.name,
            type(state.parallelism).__name__,
            len(state.algorithms),
            len(state.callbacks),
        )
        self._guard = FitGuard(
            check_preemption_signals(config.preemption_signals),
            config.preemption_grace_period,
            config.on_nonfinite_loss,
        )
        self._last_eval_batch: dict[str, int] = {}
        self.last_eval: dict[str, Any] = {}
        """Metrics of the most recent evaluation (during fit or by `eval`)."""

    # --- training --------------------------------------------------------------------------

    def fit(
        self, *, duration: Time | str | int | None = None, train_dataloader: Any = None
    ) -> None:
        """Train until ``max_duration``, or for ``duration`` more (e.g. ``"1ep"``, ``"100ba"``)."""
        state = self.state
        if train_dataloader is not None:
            self._replace_train_data(train_dataloader)
        if duration is not None:
            state.max_duration = self._extend(duration)
        if state.train_data is None:
            raise ValueError(
                "no training data: pass train_dataloader to Trainer(...) or to fit(...)"
            )
        if state.max_duration is None:
            raise ValueError(
                "no duration: pass max_duration to Trainer(...) or duration to fit(...)"
            )
        setup.refresh_schedules(state)
        # Ranks that share data (tensor parallel) count it once: the strategy says how many
        # distinct data streams there are.
        state.clear_stop()
        state.model.train()
        log.info(
            "fit from epoch %d batch %d until %s",
            state.timestamp.epoch,
            state.timestamp.batch,
            state.max_duration,
        )
        guard = self._guard
        with guard.running(state, self.engine):  # preemption, non-finite loss, FIT_ABORTED
            self.engine.run_event(Event.FIT_START)
            self.engine.run_event(Event.ITERATION_START)
            while not state.is_done() and not state.stop_requested:
                self._train_epoch()
            guard.finish(state)
            if state.is_done():
                self.engine.run_event(Event.ITERATION_END)
                self.engine.run_event(Event.ITERATION_CHECKPOINT)
            self.engine.run_event(Event.FIT_END)
            log.info(
                "fit ended at epoch %d batch %d (%s)",
                state.timestamp.epoch,
                state.timestamp.batch,
                "done" if state.is_done() else "stop requested",
            )
            if state.preemption is not None:
                self.close()  # flush the loggers: the process is about to exit
                guard.stop_preempted(state)

    def _train_epoch(self) -> None:
        state, engine = self.state, self.engine
        trained = 0
        for batch in epoch_batches(state, engine):
            clock = start_batch(state, engine, batch)
            loss = train_batch(state, engine)
            optimizer_step(state)
            finish_batch(state, engine, clock, loss)
            preempted = self._guard.after_batch(state, loss)  # all ranks agree: no eval then
            if not preempted and self._eval_triggers:
                self._maybe_eval(Event.BATCH_END)
            engine.run_event(Event.BATCH_CHECKPOINT)
            trained += 1
            if state.is_done() or state.stop_requested:
                if state.timestamp.batch_in_epoch != state.dataloader_len or (
                    preempted and not state.is_done()  # the resumed run ends the epoch
                ):
                    return  # mid-epoch: the epoch goes on in the next fit
                break
        if trained == 0 and state.timestamp.batch_in_epoch == 0:
            raise ValueError(
                "train_dataloader yielded no batches in this epoch; it must not be empty"
            )
        finish_epoch(state, engine)
        self._maybe_eval(Event.EPOCH_END)
        engine.run_event(Event.EPOCH_CHECKPOINT)

    def _maybe_eval(self, event: Event) -> None:
        if not self._eval_triggers:
            return
        state, batch = self.state, self.state.timestamp.batch
        due = [
            evaluator
            for evaluator, trigger in self._eval_triggers
            if self._last_eval_batch.get(evaluator.label) != batch and trigger(state, event)
        ]
        if due:
            for evaluator in due:
                self._last_eval_batch[evaluator.label] = batch
            self.last_eval = {**self.last_eval, **evaluate(state, self.engine, due)}

    # --- evaluation and prediction ---------------------------------------------------------

    def eval(
        self, eval_dataloader: Any = None, subset_num_batches: int | None = None
    ) -> dict[str, Any]:
        """Evaluate now on the Trainer's eval data (or on ``eval_dataloader``), on at most
        ``subset_num_batches`` batches of each (default: each evaluator's own); returns the
        metrics. Fires EVAL_STANDALONE_START / EVAL_STANDALONE_END around it."""
        state = self.state
        subset = check_subset_num_batches(subset_num_batches, "subset_num_batches")
        if eval_dataloader is not None:
            evaluators = setup.make_evaluators(eval_dataloader)
            unwrapped = state.parallelism.unwrap(state.model)
            state.eval_metrics.update(setup.eval_metrics_for(unwrapped, evaluators, state.device))
        else:
            evaluators = state.evaluators
        if not evaluators:
            raise ValueError(
                "nothing to evaluate on: pass eval_dataloader to Trainer(...) or to eval(...)"
            )
        self.last_eval = evaluate(
            state, self.engine, evaluators, standalone=True, subset_num_batches=subset
        )
        return self.last_eval

    def predict(self, dataloader: Any, *, return_outputs: bool = True) -> list[Any]:
        """Run ``eval_forward`` over ``dataloader``; returns the outputs (moved to CPU)."""
        state, engine = self.state, self.engine
        data = setup.to_dataspec(dataloader, "predict dataloader")
        model = state.parallelism.unwrap(state.model)
        was_training, outputs = model.training, []
        model.eval()
        engine.run_event(Event.PREDICT_START)
        with torch.no_grad():
            for batch in data.iter_epoch(0):
                state.batch = data.device_transfer(batch, state.device)
                engine.run_event(Event.PREDICT_BATCH_START)
                engine.run_event(Event.PREDICT_BEFORE_FORWARD)
                with state.precision.autocast():
                    state.outputs = eval_forward(model, state.batch)
                engine.run_event(Event.PREDICT_AFTER_FORWARD)
                if return_outputs:
                    outputs.append(data.device_transfer(state.outputs, torch.device("cpu")))
                engine.run_event(Event.PREDICT_BATCH_END)
        engine.run_event(Event.PREDICT_END)
        model.train(was_training)
        return outputs

    def close(self) -> None:
        """Close callbacks and logger destinations (flush files, finish remote runs)."""
        self.engine.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- helpers ---------------------------------------------------------------------------

    def _extend(self, duration: Time | str | int) -> Time:
        more = ensure_time(duration, "duration")
        if more.unit == TimeUnit.DURATION:
            raise ValueError(
                f"fit(duration={duration!r}): a fraction of the run cannot extend it; use '2ep', '100ba', ..."
            )
        return Time(self.state.timestamp.get(more.unit) + more.value, more.unit)

    def _replace_train_data(self, dataloader: Any) -> None:
        state = self.state
        state.train_data = setup.to_dataspec(dataloader, "train_dataloader")
        state.train_data.make_resumable(state.seed)
        if state.timestamp.batch_in_epoch:
            # The new data starts at its beginning, so it starts a new epoch.
            state.timestamp = state.timestamp.to_next_epoch()

    def hyperparameters(self) -> dict[str, Any]:
        """The run's configuration as plain data: every `TrainerConfig` field (components
        with their own configs), resolved where the Trainer chose (seed, device, ...)."""
        state = self.state
        resolved = {
            "seed": state.seed,
            "run_name": state.run_name,
            "device": state.device,
            "precision": state.precision.name,
            "parallelism": state.parallelism,
            "optimizers": state.optimizers,
        }
        return {**to_plain(self.config), **to_plain(resolved), "world_size": state.world_size}


def _check_max_duration(max_duration: Time | str | int | None) -> Time | None:
    if max_duration is None:
        return None
    duration = ensure_time(max_duration, "max_duration")
    if duration.unit == TimeUnit.DURATION:
        raise ValueError(
            f"max_duration {max_duration!r} is a fraction of itself; give it in epochs, batches, "
            "samples, tokens or wall-clock time, e.g. '10ep', '500ba', '1h'"
        )
    if duration.unit == TimeUnit.ITERATION:
        Timestamp().get(duration.unit)  # raises: trainkit does not count iterations (says why)
    return duration


def _check_grace_period(seconds: float | None) -> None:
    if seconds is None:
        return
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= 0:
        raise ValueError(
            f"preemption_grace_period must be a number of seconds >= 0 or None (no limit), "
            f"got {seconds!r}"
        )


def _set_deterministic(device: torch.device) -> None:
    if device.type == "cuda":
        # cuBLAS needs this before its first call to be deterministic.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
