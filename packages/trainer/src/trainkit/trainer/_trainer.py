"""The `Trainer`: a short loop; behaviour arrives as algorithms, callbacks and strategies.

The call tree, from ``fit`` to the optimizer step (each name a function in this package)::

    Trainer.__init__        State, Engine, Logger; prepare_run (_loop.py): INIT, placement,
                            strategy, compile, optimizers, schedules, BEFORE/AFTER_LOAD;
                            on rank 0 the goodput ledger (_goodput.py)
    Trainer.fit             _restage (a next stage's arguments), FitGuard.running
      _train_epoch            for each batch of epoch_batches (_loop.py):
        start_batch             count it, move it to the device, BATCH_START (_loop.py)
        train_batch             run_microbatches, retried on out-of-memory (_retry.py):
                                zero_grad, forward, loss, backward (_step.py)
        optimizer_step          state.precision.step: optimizer.step() (_step.py)
        finish_batch            timestamp, schedules, BATCH_END, goodput's count (_loop.py)
        FitGuard.after_batch    preemption vote, non-finite loss; then eval, BATCH_CHECKPOINT
      finish_epoch, EPOCH_END, EPOCH_CHECKPOINT; at the end FIT_END
"""

from __future__ import annotations

import logging
import time
from typing import Any

from trainkit.core import (
    DataSpec,
    Engine,
    Evaluator,
    Event,
    Logger,
    Precision,
    State,
    Time,
    Timestamp,
    TimeUnit,
    dist,
    ensure_time,
)
from trainkit.core.config import Configurable, to_plain
from trainkit.core.data import check_subset_num_batches
from trainkit.core.interval import IntervalTrigger, interval_trigger
from trainkit.core.meta import on_meta
from trainkit.core.precision import make_precision, resolve_device
from trainkit.core.rng import random_seed, seed_everything
from trainkit.trainer import _setup as setup
from trainkit.trainer._eval import evaluate, predict
from trainkit.trainer._fit_guard import FitGuard
from trainkit.trainer._gc import frozen_heap
from trainkit.trainer._goodput import GoodputTracker
from trainkit.trainer._loop import (
    epoch_batches,
    finish_batch,
    finish_epoch,
    prepare_run,
    start_batch,
)
from trainkit.trainer._placement import join_process_group, resolve_parallelism
from trainkit.trainer._preemption import check_preemption_signals
from trainkit.trainer._private import loop_private
from trainkit.trainer._resume import finish_complete_run, report_complete, report_resume
from trainkit.trainer._retry import train_batch
from trainkit.trainer._step import optimizer_step
from trainkit.trainer._trainer_config import TrainerConfig, check_max_duration

__all__ = ["Trainer"]

log = logging.getLogger(__name__)


class Trainer(Configurable, config=TrainerConfig):
    """Trains a `TrainModel`, as its `TrainerConfig` says.

    ``Trainer(model=..., train_dataloader=..., max_duration="10ep")`` and
    ``Trainer(TrainerConfig(...))`` are the same; see `TrainerConfig` for every field.
    """

    config: TrainerConfig

    def __init__(self, config: TrainerConfig | None = None, /, **options: Any):
        goodput = GoodputTracker()  # first: the restart time counts from here
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
            DataSpec.coerce(config.train_dataloader, "train_dataloader")
            if config.train_dataloader is not None
            else None
        )
        microbatch, auto = setup.check_microbatch_size(
            config.device_train_microbatch_size, train_data
        )
        duration = check_max_duration(config.max_duration)
        seed = dist.broadcast_object(random_seed()) if config.seed is None else config.seed
        seed_everything(seed + dist.get_rank())
        if config.deterministic:
            setup.set_deterministic(device)
        evaluators = setup.make_evaluators(config.eval_dataloader)
        if config.eval_subset_num_batches is not None and not evaluators:
            raise ValueError(
                f"eval_subset_num_batches={config.eval_subset_num_batches} without "
                "eval_dataloader has nothing to limit; give eval_dataloader or leave it unset"
            )
        self._eval_triggers = self._adopt_evaluators(evaluators)
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
            model=model if on_meta(model) else model.to(device),  # meta: in prepare_run
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
        if state.rank == 0:  # rank 0 keeps the run's goodput ledger
            loop_private(state).goodput = goodput
        prepare_run(
            state,
            self.engine,
            schedulers=config.schedulers,
            scale_schedule_ratio=config.scale_schedule_ratio,
            step_schedulers_every_batch=config.step_schedulers_every_batch,
            compile=config.compile,
        )
        if loop_private(state).goodput is not None:
            goodput.open(state, self.logger)
        self.logger.log_hyperparameters(self.hyperparameters())  # destinations started at INIT
        report_resume(state)
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
        self._gc_freeze = device.type != "cpu" if config.gc_freeze is None else config.gc_freeze
        self._last_eval_batch: dict[str, int] = {}
        self.last_eval: dict[str, Any] = {}
        """Metrics of the most recent evaluation (during fit or by `eval`)."""

    # --- training --------------------------------------------------------------------------

    def fit(
        self,
        *,
        duration: Time | str | int | None = None,
        train_dataloader: Any = None,
        reset_time: bool = False,
        train_subset_num_batches: int | None = None,
        schedulers: Any = None,
        scale_schedule_ratio: float = 1.0,
        step_schedulers_every_batch: bool | None = None,
        eval_dataloader: Any = None,
        eval_subset_num_batches: int | None = None,
        eval_interval: Time | str | int | IntervalTrigger | None = None,
        device_train_microbatch_size: int | str | None = None,
        precision: str | Precision | None = None,
    ) -> None:
        """Train until ``max_duration``, or for ``duration`` more (e.g. ``"1ep"``, ``"100ba"``).

        Calling it again trains on from where the last call stopped; its arguments change
        the run from here on, as Composer's ``fit`` does, for a next stage of training
        (new data, schedules, evaluation, microbatching or precision):

        - ``reset_time``: start the clock at zero, so trainkit schedules and algorithms
          start over as in a new run (model, optimizer state and torch LR schedulers are
          kept); it trains for ``duration`` if given, else ``max_duration`` again.
        - ``train_dataloader``, ``train_subset_num_batches``: new training data (it starts
          a new epoch), and batches per epoch.
        - ``schedulers`` (with ``scale_schedule_ratio`` and
          ``step_schedulers_every_batch``): replace the run's schedulers.
        - ``eval_dataloader`` (with ``eval_subset_num_batches`` and ``eval_interval``):
          replace the evaluators. Given alone, ``eval_subset_num_batches`` and
          ``eval_interval`` apply to the current evaluators.
        - ``device_train_microbatch_size``, ``precision``: as the Trainer's.
        """
        state = self.state
        self._restage(
            duration=duration,
            reset_time=reset_time,
            train_dataloader=train_dataloader,
            train_subset_num_batches=train_subset_num_batches,
            schedulers=schedulers,
            scale_schedule_ratio=scale_schedule_ratio,
            step_schedulers_every_batch=step_schedulers_every_batch,
            eval_dataloader=eval_dataloader,
            eval_subset_num_batches=eval_subset_num_batches,
            eval_interval=eval_interval,
            device_train_microbatch_size=device_train_microbatch_size,
            precision=precision,
        )
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
        log.info("fit from batch %d until %s", state.timestamp.batch, state.max_duration)
        guard, complete = self._guard, state.is_done()
        if complete:
            report_complete(state)
        with guard.running(state, self.engine):  # preemption, non-finite loss, FIT_ABORTED
            self.engine.run_event(Event.FIT_START)
            if (goodput := loop_private(state).goodput) is not None:
                goodput.attach()  # the Checkpointer has accepted the folder by now
            self.engine.run_event(Event.ITERATION_START)
            with frozen_heap(self._gc_freeze):
                state.wall_mark = time.perf_counter()  # batches count from here, not between fits
                try:
                    while not state.is_done() and not state.stop_requested:
                        self._train_epoch()
                finally:
                    state.wall_mark = None
            guard.finish(state)
            if complete:
                self.last_eval = finish_complete_run(state, self.engine, self.last_eval)
            if state.is_done():
                self.engine.run_event(Event.ITERATION_END)
                self.engine.run_event(Event.ITERATION_CHECKPOINT)
            if (goodput := loop_private(state).goodput) is not None:
                goodput.fit_end(state)
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
        state, engine, guard = self.state, self.engine, self._guard
        trained = 0
        for batch in epoch_batches(state, engine):
            clock = start_batch(state, engine, batch)
            loss = train_batch(state, engine)
            optimizer_step(state)
            if not state.parallelism.step_committed:
                continue  # skipped on every replica (fault tolerance): not counted
            finish_batch(state, engine, clock, loss)
            # This rank's own loss: a non-finite one is reported as this rank's.
            preempted = guard.after_batch(state, state.rank_loss)
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
            started = time.perf_counter()
            self.last_eval = {**self.last_eval, **evaluate(state, self.engine, due)}
            if state.wall_mark is not None:  # evaluation is not training time (as Composer)
                state.wall_mark += time.perf_counter() - started

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
            self._default_eval_microbatch(evaluators)
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

    def _adopt_evaluators(
        self, evaluators: list[Evaluator]
    ) -> list[tuple[Evaluator, IntervalTrigger]]:
        """Give the run's ``evaluators`` the Trainer's defaults where they set none (the
        subset of batches, the microbatch size); each with the trigger of its interval. The
        constructor and ``fit(eval_dataloader=...)`` both adopt them here."""
        for evaluator in evaluators:
            if evaluator.subset_num_batches is None:
                evaluator.subset_num_batches = self.config.eval_subset_num_batches
        self._default_eval_microbatch(evaluators)
        return [
            (e, interval_trigger(e.eval_interval or self.config.eval_interval)) for e in evaluators
        ]

    def _default_eval_microbatch(self, evaluators: list[Evaluator]) -> None:
        # The Trainer's device_eval_microbatch_size, for evaluators that set none.
        for evaluator in evaluators:
            if evaluator.device_eval_microbatch_size is None and not evaluator.auto_microbatching:
                evaluator.set_microbatch_size(self.config.device_eval_microbatch_size)

    def predict(
        self, dataloader: Any, subset_num_batches: int | None = None, *, return_outputs: bool = True
    ) -> list[Any]:
        """Run ``eval_forward`` over ``dataloader`` (its first ``subset_num_batches`` batches;
        None or -1: all); returns the outputs (moved to CPU). ``state.predict_timestamp``
        counts the batches and samples done."""
        data = DataSpec.coerce(dataloader, "predict dataloader")
        limit = check_subset_num_batches(subset_num_batches, "subset_num_batches")
        return predict(self.state, self.engine, data, limit, return_outputs=return_outputs)

    def close(self) -> None:
        """Close callbacks and logger destinations (flush files, finish remote runs)."""
        if (goodput := loop_private(self.state).goodput) is not None:
            goodput.close()  # its last ledger record
        self.engine.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- helpers ---------------------------------------------------------------------------

    def _restage(
        self,
        *,
        duration: Time | str | int | None,
        reset_time: bool,
        train_dataloader: Any,
        train_subset_num_batches: int | None,
        schedulers: Any,
        scale_schedule_ratio: float,
        step_schedulers_every_batch: bool | None,
        eval_dataloader: Any,
        eval_subset_num_batches: int | None,
        eval_interval: Any,
        device_train_microbatch_size: int | str | None,
        precision: str | Precision | None,
    ) -> None:
        # fit()'s arguments for the next stage: all checked and built before any is
        # applied, so a mistake leaves the run as it was.
        state = self.state
        if not isinstance(reset_time, bool):
            raise TypeError(f"fit(reset_time=...) must be True or False, got {reset_time!r}")
        more = self._more(duration) if duration is not None else None
        train_data = (
            DataSpec.coerce(train_dataloader, "train_dataloader")
            if train_dataloader is not None
            else None
        )
        subset = check_subset_num_batches(train_subset_num_batches, "train_subset_num_batches")
        eval_subset = check_subset_num_batches(eval_subset_num_batches, "eval_subset_num_batches")
        trigger = interval_trigger(eval_interval) if eval_interval is not None else None
        evaluators = setup.make_evaluators(eval_dataloader)
        eval_metrics = setup.eval_metrics_for(
            state.parallelism.unwrap(state.model), evaluators, state.device
        )
        if schedulers is None and (
            scale_schedule_ratio != 1.0 or step_schedulers_every_batch is not None
        ):
            raise ValueError(
                "fit(scale_schedule_ratio=..., step_schedulers_every_batch=...) applies to the "
                "schedulers given with them; pass schedulers=... too"
            )
        ratio = setup.check_scale_schedule_ratio(scale_schedule_ratio)
        # How long: ``duration`` more from now (from zero with reset_time), scaled with the
        # new schedulers; without it, max_duration (scaled with them, as Composer).
        start = Timestamp() if reset_time else state.timestamp
        if more is not None:
            more = setup.scale_max_duration(more, ratio)
            max_duration = Time(start.get(more.unit) + more.value, more.unit)
        else:
            max_duration = setup.scale_max_duration(state.max_duration, ratio)
        microbatch = (
            setup.check_microbatch_size(
                device_train_microbatch_size, train_data or state.train_data
            )
            if device_train_microbatch_size is not None
            else None
        )
        new_precision = (
            state.parallelism.precision_for(make_precision(precision, state.device))
            if precision is not None
            else None
        )
        # Built on the optimizers (a torch scheduler sets their learning rates): the last
        # step that can fail. The constructor's schedule is built by the same call.
        new_schedule = (
            setup.make_schedule(schedulers, state, ratio, step_schedulers_every_batch)
            if schedulers is not None
            else None
        )

        if reset_time:
            state.timestamp = start
        if train_data is not None:
            self._replace_train_data(train_data)
        if train_subset_num_batches is not None:
            state.train_subset_num_batches = subset
        if new_schedule is not None:
            state.schedulers, state.step_schedulers_every_batch = new_schedule
        state.max_duration = max_duration
        if evaluators:
            self._eval_triggers = self._adopt_evaluators(evaluators)
            state.evaluators = evaluators
            state.eval_metrics = eval_metrics
            self.last_eval, self._last_eval_batch = {}, {}  # the new evaluators' from here
        if eval_subset_num_batches is not None:  # -1 (all) too
            for evaluator in state.evaluators:
                evaluator.subset_num_batches = eval_subset
        if trigger is not None:  # for the evaluators without an interval of their own
            self._eval_triggers = [
                (e, t if e.eval_interval is not None else trigger) for e, t in self._eval_triggers
            ]
        if microbatch is not None:
            state.device_train_microbatch_size, state.auto_microbatching = microbatch
        if new_precision is not None:
            state.precision = new_precision

    def _more(self, duration: Time | str | int) -> Time:
        # fit(duration=...): how much longer to train, checked.
        more = ensure_time(duration, "duration")
        if more.unit == TimeUnit.DURATION:
            raise ValueError(
                f"fit(duration={duration!r}): a fraction of the run cannot extend it; use '2ep', '100ba', ..."
            )
        self.state.timestamp.get(more.unit)  # raises for units trainkit does not count
        return more

    def _replace_train_data(self, data: DataSpec) -> None:
        state = self.state
        state.train_data = data
        data.make_resumable(state.seed)
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
