"""The phases of a run, as functions of `State` and `Engine`.

The Trainer is these phases in a fixed order; a hand-written loop calls the same ones
around its own step (see the trainer README: "Your own step on the Trainer's phases")::

    prepare_run(state, engine)                      # INIT ... BEFORE_LOAD / AFTER_LOAD
    engine.run_event(Event.FIT_START)
    while not state.is_done():
        for batch in epoch_batches(state, engine):  # EPOCH_START, *_DATALOADER
            clock = start_batch(state, engine, batch)   # counts, device, BATCH_START
            ...your forward / backward / optimizer steps, firing the events you support...
            if not state.parallelism.step_committed:    # a fault-tolerant strategy skipped it
                continue
            finish_batch(state, engine, clock, loss)    # timestamp, schedulers (per batch), BATCH_END
            engine.run_event(Event.BATCH_CHECKPOINT)
            if state.is_done() or state.stop_requested:
                break
        else:
            finish_epoch(state, engine)                 # schedulers (per epoch), EPOCH_END
            engine.run_event(Event.EPOCH_CHECKPOINT)
    engine.run_event(Event.FIT_END)
    engine.close()
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import torch

from trainkit.core import Engine, Event, SingleProcess, State, TimeUnit, dist, rebind_optimizers
from trainkit.core.meta import materialize, on_meta
from trainkit.trainer import _setup as setup
from trainkit.trainer._compile import RecompileWatch, compile_options
from trainkit.trainer._model_methods import optional_method
from trainkit.trainer._private import loop_private
from trainkit.trainer._step import StepReplay, scheduler_step

__all__ = [
    "BatchClock",
    "epoch_batches",
    "finish_batch",
    "finish_epoch",
    "prepare_run",
    "start_batch",
]


def prepare_run(
    state: State,
    engine: Engine,
    *,
    schedulers: Any = None,
    scale_schedule_ratio: float = 1.0,
    step_schedulers_every_batch: bool | None = None,
    compile: bool | Mapping[str, Any] = False,
) -> None:
    """From a built `State` to the first batch: INIT, placement, strategy, loading.

    Fires INIT (surgery algorithms change the model here), moves the model to
    ``state.device`` (a model on the meta device is allocated there and initialised by
    its own init, or by a strategy that `materializes_meta` shard by shard), lets the strategy wrap or shard it (and adapt the precision), compiles
    it in place when ``compile`` is True or a dict of ``torch.compile`` keyword arguments
    (through the strategy's ``compile``: per block under FSDP), re-binds optimizers built on the
    original parameters (or builds AdamW if there are none), compiles ``schedulers`` (scaling
    them and ``state.max_duration`` by ``scale_schedule_ratio``, and choosing when they are
    stepped from ``step_schedulers_every_batch``, as Composer does), sets
    up metrics, makes the training data resumable, then fires BEFORE_LOAD (checkpoint
    loaders load here) and AFTER_LOAD.
    """
    names_before = {id(p): n for n, p in state.model.named_parameters()}
    engine.run_event(Event.INIT)
    if not on_meta(state.model):
        state.model.to(state.device)
    elif not state.parallelism.materializes_meta:  # allocated on the device, no CPU copy
        materialize(state.model, state.device, state.seed)
    state.parallelism.prepare(state)
    state.data_parallel_size = state.parallelism.data_parallel_size
    state.precision = state.parallelism.precision_for(state.precision)
    options = compile_options(compile)
    if options is not None:
        state.parallelism.compile(state.model, options)
        loop_private(state).recompiles = RecompileWatch()
    state.replay_step = StepReplay(state, engine.logger)
    unwrapped = state.parallelism.unwrap(state.model)
    load_weights = optional_method(unwrapped, "load_weights")
    if load_weights is not None:  # pretrained weights into a meta-built model, as placed now
        load_weights()
    rebind_optimizers(state.optimizers, unwrapped, names_before)
    if not state.optimizers:
        state.optimizers = [torch.optim.AdamW(unwrapped.parameters(), lr=1e-3)]
    state.schedulers, state.step_schedulers_every_batch = setup.make_schedule(
        schedulers, state, scale_schedule_ratio, step_schedulers_every_batch
    )
    state.max_duration = setup.scale_max_duration(state.max_duration, scale_schedule_ratio)
    state.train_metrics = setup.train_metrics_for(unwrapped, state.device)
    state.eval_metrics = setup.eval_metrics_for(unwrapped, state.evaluators, state.device)
    if state.train_data is not None:
        state.train_data.make_resumable(state.seed)
    goodput = loop_private(state).goodput
    if goodput is not None:
        goodput.mark("prepare")
    engine.run_event(Event.BEFORE_LOAD)
    engine.run_event(Event.AFTER_LOAD)
    if goodput is not None:
        goodput.mark("load")


def epoch_batches(state: State, engine: Engine) -> Iterator[Any]:
    """The current epoch's remaining batches: all of them (at most
    ``state.train_subset_num_batches``), or after a resume the rest.

    Fires EPOCH_START (only when the epoch begins), then BEFORE_DATALOADER and
    AFTER_DATALOADER around each batch, which is also put in ``state.batch`` (after the
    data's ``batch_transforms``).
    """
    assert state.train_data is not None, "epoch_batches needs state.train_data"
    done = state.timestamp.batch_in_epoch
    if done == 0:
        for metric in state.train_metrics.values():
            metric.reset()
        engine.run_event(Event.EPOCH_START)
    iterator = state.train_data.iter_epoch(state.timestamp.epoch, done)
    if state.train_subset_num_batches is not None:
        iterator = itertools.islice(iterator, max(0, state.train_subset_num_batches - done))
    transform = state.train_data.batch_transforms
    while True:
        engine.run_event(Event.BEFORE_DATALOADER)
        try:
            batch = next(iterator)
        except StopIteration:
            return
        state.batch = batch if transform is None else transform(batch)
        engine.run_event(Event.AFTER_DATALOADER)
        yield state.batch


class BatchClock(NamedTuple):
    """What `start_batch` measured, for `finish_batch`."""

    samples: int
    tokens: int
    started: float
    """When the batch's wall-clock time began: ``state.wall_mark``, or `start_batch`."""


def start_batch(state: State, engine: Engine, batch: Any) -> BatchClock:
    """Count the batch, move it to the device (into ``state.batch``), fire BATCH_START.

    The batch's wall-clock time counts from ``state.wall_mark`` when it is set (``fit``
    sets it: from the end of the previous batch, so loading this one is included), or else
    from here.
    """
    data = state.train_data
    assert data is not None
    started = state.wall_mark
    if started is None:
        started = time.perf_counter()
    # Over all data-parallel ranks; ranks that share data (tensor parallel) count it once.
    samples, tokens = data.count_batch(batch, state.data_parallel_size, state.device)
    clock = BatchClock(samples, tokens, started)
    state.batch = data.device_transfer(batch, state.device)
    engine.run_event(Event.BATCH_START)
    return clock


def finish_batch(
    state: State, engine: Engine, clock: BatchClock, loss: torch.Tensor | None
) -> None:
    """Advance the timestamp, step the LR schedulers (when stepped every batch), log the loss,
    fire BATCH_END; then, in a Trainer's run, count the step for goodput if it was committed.

    With a wall-clock ``max_duration`` on ranks that train together, every rank counts the
    slowest rank's batch time (one small CPU collective per batch, in such runs only): each
    rank's own clock would stop them after different batches (a rank left waiting in a
    collective) and give them different learning rates (replicas drifting apart).
    """
    now = time.perf_counter()
    duration = now - clock.started
    max_duration = state.max_duration
    if max_duration is not None and max_duration.unit is TimeUnit.SECOND:
        duration = _slowest_rank(state, duration)
    samples, tokens, _ = clock
    state.timestamp = state.timestamp.to_next_batch(samples, tokens, duration)
    if state.wall_mark is not None:  # a clock that runs between batches (State.wall_mark)
        state.wall_mark = now
    if state.step_schedulers_every_batch and state.schedulers:
        scheduler_step(state)
    if loss is not None and engine.logger.destinations:
        engine.logger.log_metrics({"loss/train/total": loss})
    private = loop_private(state)
    if private.recompiles is not None:
        private.recompiles.batch_end(engine.logger)
    engine.run_event(Event.BATCH_END)
    if private.goodput is not None:  # after BATCH_END: a step not committed is not counted
        private.goodput.batch_end(state, now)


_clock_group: list[Any] = []  # [(the run's process group, a gloo group for the clock)]


def _slowest_rank(state: State, duration: float) -> float:
    if dist.get_world_size() == 1 or isinstance(state.parallelism, SingleProcess):
        return duration  # alone, or independent replicas (each keeps its own clock)
    import torch.distributed as tdist

    world = tdist.group.WORLD
    if not _clock_group or _clock_group[0][0] is not world:  # a new process group
        # Collective: every rank finishes its first batch of the run here.
        _clock_group[:] = [(world, tdist.new_group(backend="gloo"))]
    seconds = torch.tensor([duration], dtype=torch.float64)
    tdist.all_reduce(seconds, op=tdist.ReduceOp.MAX, group=_clock_group[0][1])
    return float(seconds.item())


def finish_epoch(state: State, engine: Engine) -> None:
    """Advance to the next epoch, step the LR schedulers (when stepped every epoch), log the
    epoch's train metrics, fire EPOCH_END."""
    state.timestamp = state.timestamp.to_next_epoch()
    if not state.step_schedulers_every_batch:
        scheduler_step(state)
    if state.train_metrics:
        engine.logger.log_metrics(
            {f"metrics/train/{k}": m.compute() for k, m in state.train_metrics.items()}
        )
    engine.run_event(Event.EPOCH_END)
