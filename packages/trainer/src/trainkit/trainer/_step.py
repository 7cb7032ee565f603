"""The pieces of a training step, as functions of `State` and `Engine`.

The Trainer is written on these; a hand-written loop calls the same ones (see the trainer
README, "Your own step on the Trainer's phases"), so the two cannot drift apart.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from trainkit.core import Engine, Event, Logger, SingleProcess, State, dist
from trainkit.core.precision import NO_AUTOCAST
from trainkit.trainer._model_methods import optional_method
from trainkit.trainer._oom import OTHER_RANK_MESSAGE, settle

__all__ = [
    "StepReplay",
    "microbatch_weights",
    "optimizer_step",
    "run_microbatches",
    "scheduler_step",
]

_SYNC = contextlib.nullcontext()  # the last microbatch synchronises: nothing to enter


def run_microbatches(state: State, engine: Engine) -> torch.Tensor:
    """Forward and backward over ``state.batch`` in microbatches; returns the batch loss.

    Each microbatch's loss is weighted by its share of the batch, so the accumulated
    gradient equals the gradient of the whole batch's mean loss. The share is counted by
    the model's ``loss_weight(batch)`` when it has one (label tokens, for token-mean
    losses), else in samples; with ``loss_weight``, data-parallel ranks are weighted by
    their share of the step's total too (`_rank_share`); a microbatch, or a rank's batch,
    that weighs nothing (no label token) adds nothing to the loss (`_weighed`). The
    returned loss (also ``state.total_loss``) is the step's, the same on every
    data-parallel rank: the mean over the ranks, weighted as the gradient is. Under
    ``state.auto_microbatching``, every rank raises `torch.OutOfMemoryError` when any rank
    ran out of memory (`settle`: one collective per call when no rank did), so that all
    can retry together (`train_batch`).
    Gradient synchronisation is skipped (``parallelism.no_sync``) for all but the last
    microbatch. A strategy that `runs_forward_backward` (pipeline parallel) runs the
    microbatches' forward and backward itself, with the events it documents.
    ``state.outputs`` is set to None after AFTER_LOSS unless a registered component
    declares ``needs_outputs`` (`Engine.outputs_needed`), so the model's outputs are freed
    before backward. The data's ``microbatch_transforms`` is applied to each microbatch.
    ``state.batch`` is the whole batch again afterwards.
    """
    batch, data = state.batch, state.train_data
    assert data is not None, "run_microbatches needs state.train_data"
    model = state.model
    unwrapped = state.parallelism.unwrap(model)
    microbatches = _split(state, batch) if state.device_train_microbatch_size else None
    pipelined = state.parallelism.runs_forward_backward
    if microbatches is not None and (len(microbatches) > 1 or pipelined):
        weights = microbatch_weights(unwrapped, data, microbatches)
    else:
        microbatches = None  # the whole batch at once: no loop (this runs every step)
    # Gradients averaged over data-parallel replicas (not one replica, nor independent ones).
    averaged = state.data_parallel_size > 1 and not isinstance(state.parallelism, SingleProcess)
    share = _rank_share(state, unwrapped, batch) if averaged else None
    autocast = state.precision.autocast()
    engine.run_event(Event.BEFORE_TRAIN_BATCH)
    for optimizer in state.optimizers:
        optimizer.zero_grad(set_to_none=True)
    transform = data.microbatch_transforms
    failed: torch.OutOfMemoryError | None = None
    try:
        if pipelined:  # the strategy's schedule runs every microbatch's forward and backward
            parts = microbatches or [batch]
            if transform is not None:
                parts = [transform(part) for part in parts]
            total = state.parallelism.forward_backward(
                state, engine, parts, weights if microbatches else [None], share
            )
        elif microbatches is None:
            if transform is not None:
                state.batch = transform(batch)
            total = _forward_backward(state, engine, model, unwrapped, autocast, None, share)
        else:
            total = None
            last = len(microbatches) - 1
            for index, (microbatch, weight) in enumerate(zip(microbatches, weights, strict=True)):
                state.batch = microbatch if transform is None else transform(microbatch)
                with _SYNC if index == last else state.parallelism.no_sync(model):
                    scaled = _forward_backward(
                        state, engine, model, unwrapped, autocast, weight, share
                    )
                part = _weighed(scaled.detach(), weight)
                total = part if total is None else total + part
            assert total is not None
    except torch.OutOfMemoryError as error:
        if not state.auto_microbatching:
            raise
        failed = error
    state.batch = batch
    if state.auto_microbatching and settle(failed is not None, state.device):
        # Every rank stops here alike, before the collectives below.
        raise failed or torch.OutOfMemoryError(OTHER_RANK_MESSAGE)
    total = total.detach()
    if share is not None:
        total = _weighed(total, share)  # this rank's batch may weigh nothing
    state.rank_loss = total
    if averaged:
        total = _mean_over_ranks(total, share)
    state.total_loss = total
    engine.run_event(Event.AFTER_TRAIN_BATCH)
    return total


class StepReplay:
    """A run's `State.replay_step`: the current batch's microbatches again, with their events.

    On an engine of its own: a method replays the step from inside an event (SAM at
    AFTER_TRAIN_BATCH), while the run's engine is still dispatching it.
    """

    def __init__(self, state: State, logger: Logger) -> None:
        self._state, self._logger = state, logger
        self._engine: Engine | None = None

    def __call__(self) -> torch.Tensor:
        if self._engine is None:
            self._engine = Engine(self._state, self._logger)
        return run_microbatches(self._state, self._engine)


def _forward_backward(
    state: State,
    engine: Engine,
    model: nn.Module,
    unwrapped: nn.Module,
    autocast: contextlib.AbstractContextManager[None],
    weight: float | None,
    share: torch.Tensor | None,
) -> torch.Tensor:
    # One microbatch (state.batch): forward, loss, backward with their events; returns the
    # loss weighted by the microbatch's share of this rank's batch. The backward also
    # weighs it by ``share``, this rank's part of the data-parallel batch (`_rank_share`).
    engine.run_event(Event.BEFORE_FORWARD)
    if autocast is NO_AUTOCAST:  # fp32: no context to enter (this runs every step)
        state.outputs = model(state.batch)
    else:
        with autocast:
            state.outputs = model(state.batch)
    engine.run_event(Event.AFTER_FORWARD)
    if state.train_metrics:
        _update_train_metrics(state, unwrapped)
    engine.run_event(Event.BEFORE_LOSS)
    if autocast is NO_AUTOCAST:
        state.loss = unwrapped.loss(state.outputs, state.batch)
    else:
        with autocast:
            state.loss = unwrapped.loss(state.outputs, state.batch)
    engine.run_event(Event.AFTER_LOSS)
    if not engine.outputs_needed():
        state.outputs = None  # not kept alive through backward and the step
    engine.run_event(Event.BEFORE_BACKWARD)
    scaled = state.loss if weight is None else state.loss * weight
    state.precision.backward(scaled if share is None else scaled * share)
    engine.run_event(Event.AFTER_BACKWARD)
    return scaled


def _weighed(loss: torch.Tensor, weight: Any) -> torch.Tensor:
    # A microbatch, or a rank's batch, that weighs nothing (no label token) adds nothing to
    # the step's loss. Its own token mean is 0/0 for models that do not take
    # num_items_in_batch (BERT, T5, ...): NaN, which would stop a step that trains fine, as
    # its gradient is zero. Computed on the device: no host sync.
    if isinstance(weight, torch.Tensor):  # a model's loss_weight: maybe counted elsewhere
        return torch.where((weight > 0).to(loss.device, non_blocking=True), loss, 0.0)
    return loss


def _split(state: State, batch: Any) -> list[Any]:
    size, data = state.device_train_microbatch_size, state.train_data
    assert data is not None
    if not size or size >= data.get_num_samples_in_batch(batch):
        return [batch]
    return list(data.split_batch(batch, size))


def microbatch_weights(model: nn.Module, data: Any, microbatches: list[Any]) -> list[Any]:
    """Each microbatch's share of the batch, by the model's ``loss_weight(batch)`` (label
    tokens, for token-mean losses) or else in samples; ``[None]`` for a single microbatch
    (its loss is used as it is, with no extra node in the graph)."""
    if len(microbatches) == 1:
        return [None]
    measure = optional_method(model, "loss_weight") or data.get_num_samples_in_batch
    counts = [measure(microbatch) for microbatch in microbatches]
    total = sum(counts)
    return [count / total for count in counts]


def _rank_share(state: State, model: nn.Module, batch: Any) -> torch.Tensor | None:
    """How much this rank's loss weighs in the data-parallel batch, for a model whose loss is
    a mean over its ``loss_weight`` (label tokens); None when there is nothing to weigh.
    Called only where replicas average their gradients.

    Data-parallel ranks average their gradients, which weighs every rank's batch alike. A
    rank with 1000 label tokens and one with 200 would then count each of the second
    rank's tokens 5 times as much. Scaling each rank's loss by ``world * local / total``
    (``total`` summed over all ranks, in one scalar all-reduce per step) makes the averaged
    gradient that of the mean over every label token of the step, as one process training
    on the whole batch would get (Composer's ``accumulate_train_batch_on_tokens``). Ranks
    that read one batch (tensor parallel) count it once each and cancel out.
    """
    measure = optional_method(model, "loss_weight")
    if measure is None:
        return None
    local = torch.as_tensor(measure(batch), device=state.device).to(torch.float32)
    total = dist.all_reduce(local.clone(), "sum")
    return local * dist.get_world_size() / total


def _mean_over_ranks(loss: torch.Tensor, share: torch.Tensor | None) -> torch.Tensor:
    # The step's loss over the data-parallel ranks (one scalar all-reduce per step), as
    # Composer logs it: every rank then logs, and decides on, the same value.
    weighted = loss.float() * share if share is not None else loss.float()
    return dist.all_reduce(weighted.clone(), "sum") / dist.get_world_size()


def _update_train_metrics(state: State, unwrapped: nn.Module) -> None:
    with torch.no_grad():
        for metric in state.train_metrics.values():
            unwrapped.update_metric(state.batch, state.outputs, metric)


def optimizer_step(state: State) -> None:
    """Step every optimizer, as the run's precision does it (through a grad scaler for fp16)."""
    state.precision.step(state.optimizers)


def scheduler_step(state: State) -> None:
    """Step every LR scheduler; call it after advancing ``state.timestamp`` (the loop calls it
    after each batch, or after each epoch when ``state.step_schedulers_every_batch`` is
    False)."""
    for scheduler in state.schedulers:
        scheduler.step()
