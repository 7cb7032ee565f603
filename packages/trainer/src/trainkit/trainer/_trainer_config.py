"""`TrainerConfig`: every option of the `Trainer`, declared once (also the CLI's schema)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from trainkit.core import (
    Algorithm,
    LoggerDestination,
    ParallelStrategy,
    Precision,
    Time,
    Timestamp,
    TimeUnit,
    ensure_time,
)
from trainkit.core.config import slot
from trainkit.core.data import check_microbatch_size_value, check_subset_num_batches
from trainkit.core.interval import IntervalTrigger, interval_trigger
from trainkit.core.precision import check_device, check_precision
from trainkit.trainer import _setup as setup
from trainkit.trainer._compile import compile_options
from trainkit.trainer._nonfinite import check_nonfinite_mode
from trainkit.trainer._preemption import check_preemption_signals

__all__ = ["TrainerConfig", "check_max_duration"]


@dataclass(kw_only=True)
class TrainerConfig:
    """Everything a `Trainer` is built from. ``Trainer(**fields)`` builds it for you."""

    unknown_field_hints: ClassVar[Mapping[str, str]] = {
        # Composer's Trainer arguments that trainkit spells or does otherwise
        # (docs/coming-from-composer.md): what a ported script should say instead.
        "parallelism_config": "give parallelism=FSDP(...), TensorParallel(...) or DDP(...) "
        "from trainkit.parallel",
        "deterministic_mode": "use deterministic=True",
        "precision_config": "give precision=MixedPrecision(...) (a Precision object)",
        "compile_config": "use compile=True or compile={...} (torch.compile keyword arguments)",
        "ddp_sync_strategy": "give parallelism=DDP(sync=...)",
        "dist_timeout": "call trainkit.core.dist.init_distributed(timeout=...) before the Trainer",
        "console_stream": "give loggers=[ConsoleLogger(stream=...)] (trainkit.loggers)",
        "profiler": "give callbacks=[Profiler(...)] (trainkit.profiler)",
        "algorithm_passes": "set Algorithm.ordering_passes, or call "
        "trainer.engine.register_pass(...)",
        "load_object_store": "give a URL as load_path (s3://..., gs://..., az://...)",
        "accumulate_train_batch_on_tokens": "not needed: a model's loss_weight(batch) weighs "
        "microbatches and ranks (HuggingFaceModel counts label tokens); remove it",
        "train_dataloader_label": "not needed: the training data is labelled 'train'; remove it",
        "spin_dataloaders": "not needed: a resumed loader is positioned without spinning; remove it",
        "auto_log_hparams": "not needed: every field is logged; remove it",
        "load_progress_bar": "not needed; remove it",
        "save_latest_filename": "not needed: 'latest' is written beside the checkpoints; remove it",
        "save_metrics": "not needed: metrics are always saved with the run; remove it",
        "save_ignore_keys": "not supported; save_weights_only=True saves the model alone",
    }

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
    """trainkit schedules (`trainkit.trainer.schedulers`) or torch LR schedulers; when they are
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
    device_eval_microbatch_size: int | str | None = None
    """Evaluate in microbatches of this many samples, or ``"auto"`` (whole batches, halved
    on out-of-memory, agreed across ranks); None: whole batches. An `Evaluator` may set its
    own."""
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
    gc_freeze: bool | None = None
    """Collect garbage once before the first batch, then freeze every object alive for the
    fit (``gc.freeze``), so that Python's collections during training scan only objects
    made since: a full collection of a process that imported torch pauses the host for
    ~0.1-0.4 s, which a host-bound step (FSDP) or every other rank then waits for. None:
    on when the device is not the CPU. A heap the program froze itself is left as it is."""
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
        check_max_duration(self.max_duration)
        interval_trigger(self.eval_interval)
        check_precision(self.precision)
        check_device(self.device)
        setup.check_microbatch_size(self.device_train_microbatch_size, None)
        setup.check_scale_schedule_ratio(self.scale_schedule_ratio)
        compile_options(self.compile)
        self.eval_subset_num_batches = check_subset_num_batches(
            self.eval_subset_num_batches, "eval_subset_num_batches"
        )
        check_microbatch_size_value(self.device_eval_microbatch_size, "device_eval_microbatch_size")
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


def check_max_duration(max_duration: Time | str | int | None) -> Time | None:
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
