"""Evaluation and prediction, as functions of `State` and `Engine`: every evaluator's
batches, in microbatches when asked (halved on out-of-memory with ``"auto"``), each
sample counted once over the ranks; and a loader's outputs.

The Trainer evaluates and predicts with these; a hand-written loop calls the same
`evaluate`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from typing import Any, Literal

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

from trainkit.core import DataSpec, Engine, Evaluator, Event, State, Timestamp
from trainkit.trainer._model_methods import optional_method
from trainkit.trainer._oom import oom_checkpoints_for, settle
from trainkit.trainer._retry import free_after_oom, restore_metrics, save_metrics

__all__ = ["eval_forward", "evaluate", "predict"]


def evaluate(
    state: State,
    engine: Engine,
    evaluators: Iterable[Evaluator] | None = None,
    *,
    standalone: bool = False,
    subset_num_batches: int | None = None,
) -> dict[str, Any]:
    """Run every evaluator; log and return ``{"metrics/<label>/<name>": value}``.

    The evaluation is wrapped in EVAL_BEFORE_ALL / EVAL_AFTER_ALL, or with ``standalone``
    (an evaluation outside ``fit``, as `Trainer.eval`) in EVAL_STANDALONE_START / _END.
    Each evaluator reads at most ``subset_num_batches`` batches (default: its own
    ``subset_num_batches``; None: all).
    """
    evaluators = state.evaluators if evaluators is None else list(evaluators)
    model = state.parallelism.unwrap(state.model)
    was_training = model.training
    results: dict[str, Any] = {}
    engine.run_event(Event.EVAL_STANDALONE_START if standalone else Event.EVAL_BEFORE_ALL)
    model.eval()
    label = state.dataloader_label
    try:
        for evaluator in evaluators:
            limit = subset_num_batches or evaluator.subset_num_batches
            state.dataloader_label = evaluator.label
            results.update(_evaluate_one(state, engine, model, evaluator, limit))
    finally:
        model.train(was_training)
        state.dataloader_label = label
    engine.run_event(Event.EVAL_STANDALONE_END if standalone else Event.EVAL_AFTER_ALL)
    return results


def _evaluate_one(
    state: State, engine: Engine, model: nn.Module, evaluator: Evaluator, limit: int | None
) -> dict[str, Any]:
    metrics = state.eval_metrics[evaluator.label]
    for metric in metrics.values():
        metric.reset()
    state.eval_timestamp = Timestamp()
    engine.run_event(Event.EVAL_START)
    data = evaluator.data
    repeat = _repeated_at_end(data)
    batches = data.iter_epoch(0)
    if limit is not None:
        batches = itertools.islice(batches, limit)
    with torch.no_grad():
        started = time.perf_counter()
        for index, batch in enumerate(batches):
            if data.batch_transforms is not None:
                batch = data.batch_transforms(batch)
            state.batch = data.device_transfer(batch, state.device)
            engine.run_event(Event.EVAL_BATCH_START)
            drop = None
            if repeat is not None and index == repeat[0]:
                drop = "batch" if repeat[1] else "sample"
            # This rank's counts: ranks may hold different numbers of eval batches, so a
            # collective per batch could leave one waiting.
            samples, tokens = _evaluate_batch(state, engine, model, evaluator, metrics, drop)
            now = time.perf_counter()
            state.eval_timestamp = state.eval_timestamp.to_next_batch(
                samples, tokens, now - started
            )
            started = now
            engine.run_event(Event.EVAL_BATCH_END)
    results = {f"metrics/{evaluator.label}/{name}": m.compute() for name, m in metrics.items()}
    engine.logger.log_metrics(results)
    engine.run_event(Event.EVAL_END)
    return results


def _evaluate_batch(
    state: State,
    engine: Engine,
    model: nn.Module,
    evaluator: Evaluator,
    metrics: dict[str, Any],
    drop: Literal["sample", "batch"] | None,
) -> tuple[int, int]:
    # state.batch in the evaluator's microbatches, halving them on out-of-memory when auto
    # (every rank retries together, as in training); ``drop`` leaves a repeated last sample
    # (or the whole batch) out of the metrics. state.batch is the whole batch afterwards.
    # Returns the samples and tokens counted.
    batch = state.batch
    auto = evaluator.auto_microbatching
    checkpoints = oom_checkpoints_for(state, evaluator) if auto else None
    retried = False
    try:
        while True:
            saved = save_metrics(metrics) if auto else None
            if checkpoints is not None:
                checkpoints.arm(state)
            try:
                counted = _eval_microbatches(state, engine, model, evaluator, metrics, drop)
                out_of_memory = False
            except torch.OutOfMemoryError:
                if not auto:
                    raise
                out_of_memory = True
            if auto:
                out_of_memory = settle(out_of_memory, state.device)
            state.batch = batch
            if not out_of_memory:
                if checkpoints is not None:
                    checkpoints.batch_done(retried)
                return counted
            retried = True
            state.outputs = None
            # E.g. FSDP2's reset_iter_state: blocks left gathered by the failed forward
            # would otherwise skip their gather on one rank only in the retry.
            state.parallelism.reset_after_oom(state.model)
            assert saved is not None
            restore_metrics(metrics, saved)
            free_after_oom(state)
            current = (
                evaluator.device_eval_microbatch_size
                or evaluator.data.get_num_samples_in_batch(batch)
            )
            if current <= 1:
                raise RuntimeError(
                    f"out of memory evaluating {evaluator.label!r} with "
                    f"device_eval_microbatch_size=1: one sample does not fit on {state.device}. "
                    "Use lower precision ('amp_bf16'), a shorter sequence, or shard the model (FSDP)"
                )
            evaluator.device_eval_microbatch_size = current // 2
    finally:
        if checkpoints is not None:
            checkpoints.disarm()


def _eval_microbatches(
    state: State,
    engine: Engine,
    model: nn.Module,
    evaluator: Evaluator,
    metrics: dict[str, Any],
    drop: Literal["sample", "batch"] | None,
) -> tuple[int, int]:
    data, batch, size = evaluator.data, state.batch, evaluator.device_eval_microbatch_size
    if size and size < data.get_num_samples_in_batch(batch):
        microbatches = list(data.split_batch(batch, size))
    else:
        microbatches = [batch]
    last = len(microbatches) - 1
    samples = tokens = 0
    for index, microbatch in enumerate(microbatches):
        count = drop != "batch"
        if drop == "sample" and index == last:
            # Within the last microbatch, so every rank runs as many forwards.
            microbatch, count = _drop_repeat(data, microbatch)
        if data.microbatch_transforms is not None:
            microbatch = data.microbatch_transforms(microbatch)
        state.batch = microbatch
        engine.run_event(Event.EVAL_BEFORE_FORWARD)
        with state.precision.autocast():
            state.outputs = eval_forward(model, state.batch)
        engine.run_event(Event.EVAL_AFTER_FORWARD)
        if count:
            for metric in metrics.values():
                model.update_metric(state.batch, state.outputs, metric)
            samples += data.get_num_samples_in_batch(state.batch)
            tokens += data.get_num_tokens_in_batch(state.batch)
    return samples, tokens


def _repeated_at_end(data: DataSpec) -> tuple[int, bool] | None:
    """Where this rank's eval data ends in a sample that a `DistributedSampler` repeated.

    Without ``drop_last``, a `DistributedSampler` pads the index list with its first
    indices until every rank gets as many; the repeats are the last index of ranks
    ``num_replicas - padding`` and up. Metrics are summed over ranks, so evaluating a
    repeat would count its sample twice (Composer removes it too). Returns the index of the
    batch that holds the repeat, and whether the repeat is that whole batch (a loader with
    ``batch_size=None``, whose indices are batches) or its last sample; None when this rank
    has no repeat, or when the loader is not a `DataLoader` over a `DistributedSampler`.
    """
    loader = data.dataloader
    if not isinstance(loader, DataLoader):
        return None
    batches = loader.batch_sampler
    if batches is None:
        sampler = loader.sampler
    elif type(batches) is BatchSampler:
        sampler = batches.sampler
    else:
        return None  # the user's own batch sampler: where the repeat lands is its business
    # A subclass that draws its own indices may pad differently (or not at all).
    if (
        not isinstance(sampler, DistributedSampler)
        or type(sampler).__iter__ is not DistributedSampler.__iter__
        or sampler.drop_last
    ):
        return None
    padding = sampler.total_size - len(sampler.dataset)  # type: ignore[arg-type]
    if sampler.rank < sampler.num_replicas - padding:
        return None
    if batches is None:
        return len(sampler) - 1, True
    if batches.drop_last and len(sampler) % batches.batch_size:
        return None  # the last, partial batch is dropped, and the repeat with it
    return len(batches) - 1, False


def _drop_repeat(data: DataSpec, batch: Any) -> tuple[Any, bool]:
    # The batch without its last sample, and whether the metrics should count it. A batch
    # that is only the repeat still goes through the forward (sharded models need every
    # rank in every forward), uncounted.
    size = data.get_num_samples_in_batch(batch)
    if size <= 1:
        return batch, False
    return data.split_batch(batch, size - 1)[0], True


def predict(
    state: State, engine: Engine, data: DataSpec, limit: int | None, *, return_outputs: bool
) -> list[Any]:
    """``eval_forward`` over ``data`` (its first ``limit`` batches; None: all), with the
    PREDICT_* events; returns the outputs moved to CPU (``[]`` without
    ``return_outputs``). ``state.predict_timestamp`` counts this rank's batches and
    samples."""
    model = state.parallelism.unwrap(state.model)
    was_training, outputs = model.training, []
    model.eval()
    state.predict_timestamp = Timestamp()
    engine.run_event(Event.PREDICT_START)
    batches = data.iter_epoch(0)
    if limit is not None:
        batches = itertools.islice(batches, limit)
    try:
        with torch.no_grad():
            started = time.perf_counter()
            for batch in batches:
                if data.batch_transforms is not None:
                    batch = data.batch_transforms(batch)
                state.batch = data.device_transfer(batch, state.device)
                if data.microbatch_transforms is not None:
                    state.batch = data.microbatch_transforms(state.batch)
                engine.run_event(Event.PREDICT_BATCH_START)
                engine.run_event(Event.PREDICT_BEFORE_FORWARD)
                with state.precision.autocast():
                    state.outputs = eval_forward(model, state.batch)
                engine.run_event(Event.PREDICT_AFTER_FORWARD)
                if return_outputs:
                    outputs.append(data.device_transfer(state.outputs, torch.device("cpu")))
                samples = data.get_num_samples_in_batch(state.batch)  # this rank's
                tokens = data.get_num_tokens_in_batch(state.batch)
                now = time.perf_counter()
                state.predict_timestamp = state.predict_timestamp.to_next_batch(
                    samples, tokens, now - started
                )
                started = now
                engine.run_event(Event.PREDICT_BATCH_END)
    finally:
        model.train(was_training)  # also when a batch fails
    engine.run_event(Event.PREDICT_END)
    return outputs


def eval_forward(model: nn.Module, batch: Any) -> Any:
    """``model.eval_forward(batch)``, or ``model(batch)`` for a model without one."""
    method = optional_method(model, "eval_forward")
    return model(batch) if method is None else method(batch)
