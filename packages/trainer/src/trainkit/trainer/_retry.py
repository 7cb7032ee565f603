"""Retrying a batch after out-of-memory, under auto-microbatching: the step again with half
the microbatch size, after the failed attempt is undone (gradients, outputs, the strategy's
and the precision's per-step state, and the metrics it counted).

`train_batch` is the step (`run_microbatches`) with this retry around it; evaluation
uses the same metric snapshots (`save_metrics`, `restore_metrics`).
"""

from __future__ import annotations

import copy
import gc
from typing import Any

import torch
from torch import nn

from trainkit.core import Engine, State
from trainkit.trainer._oom import oom_checkpoints_for
from trainkit.trainer._step import run_microbatches
from trainkit.trainer.metrics import Metric

__all__ = ["free_after_oom", "restore_metrics", "save_metrics", "train_batch"]


def train_batch(state: State, engine: Engine) -> torch.Tensor:
    """`run_microbatches`, halving the microbatch size on out-of-memory when auto.

    With ``state.auto_microbatching``, every rank reports whether it ran out of memory
    (one collective per attempt, in `run_microbatches`) and all retry together with half
    the size, after clearing gradients, outputs, the strategy's and the precision's
    per-step state. On several ranks, the strategy's out-of-memory checkpoints are
    installed while the size is being searched (`OOMCheckpoints`): a rank that runs out
    of memory part-way through a forward or backward then stops the others before their
    next collective, instead of leaving them waiting in it.
    """
    if not state.auto_microbatching:
        return run_microbatches(state, engine)
    batch = state.batch
    checkpoints = oom_checkpoints_for(state)
    out_of_memory = False
    try:
        while True:
            # A failed attempt may already have counted some microbatches in the metrics.
            saved = save_metrics(state.train_metrics)
            if checkpoints is not None:
                checkpoints.arm(state)
            try:
                loss = run_microbatches(state, engine)
            except torch.OutOfMemoryError:
                out_of_memory = True
            else:
                if checkpoints is not None:
                    checkpoints.batch_done(out_of_memory)
                return loss
            _clear_after_oom(state, batch)
            restore_metrics(state.train_metrics, saved)
            _halve_microbatch(state, batch)
    finally:
        if checkpoints is not None:
            checkpoints.disarm()


def save_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    # Runs every batch under auto microbatching, so it must be cheap and must not grow with
    # what a metric has seen: a trainkit Metric that keeps nothing beyond its two running
    # sums (it does not override reset) is saved as one stacked tensor; a torchmetrics
    # metric as its states (`_MetricStates`); any other object is copied whole.
    return {name: _save_metric(metric) for name, metric in metrics.items()}


def _save_metric(metric: Any) -> Any:
    if _sums_only(metric):
        return torch.stack((metric.total, metric.count))
    if _MetricStates.applies_to(metric):
        return _MetricStates(metric)
    return copy.deepcopy(metric)


def _sums_only(metric: Any) -> bool:
    return isinstance(metric, Metric) and type(metric).reset is Metric.reset


class _MetricStates:
    """A torchmetrics metric's states as they were before a batch, to undo its updates.

    Copying the whole metric (measured on 2 CPU cores) cost 177-182 us per batch for a
    10-class accuracy, and for a metric that keeps every prediction (AUROC: list states) it
    grows with the batches seen: 2.3-3.6 ms per batch after 100. Saving the states costs
    6 us and 1.5-1.8 us.

    Tensor states are cloned (updates change them in place); a list state is kept as the
    list and its length: updates append to it (or replace it), so restoring puts the same
    list back, cut to that length.
    """

    _EXTRA = ("_update_count", "_computed")  # what update() changes besides the states

    @staticmethod
    def applies_to(metric: Any) -> bool:
        # A torchmetrics.Metric, recognised without importing torchmetrics: its states are
        # the names in its own _defaults (add_state). Copied whole instead: a wrapper
        # (ClasswiseWrapper, MetricTracker, ...: other metrics inside it, whose states it
        # may reach through attribute delegation) and a MetricCollection (its compute
        # groups share states between metrics).
        if not isinstance(metric, nn.Module) or not isinstance(vars(metric).get("_defaults"), dict):
            return False
        if not all(hasattr(metric, name) for name in _MetricStates._EXTRA):
            return False
        return not _holds_metrics(metric)

    def __init__(self, metric: Any) -> None:
        self.lists: dict[str, tuple[list[Any], int]] = {}
        self.values: dict[str, Any] = {name: getattr(metric, name) for name in self._EXTRA}
        for name in metric._defaults:
            value = getattr(metric, name)
            if type(value) is list:
                self.lists[name] = (value, len(value))
            elif isinstance(value, torch.Tensor):
                self.values[name] = value.clone()
            else:  # torchmetrics allows tensors and lists only
                self.values[name] = copy.deepcopy(value)

    def restore(self, metric: Any) -> None:
        for name, (items, length) in self.lists.items():
            del items[length:]
            setattr(metric, name, items)
        for name, value in self.values.items():
            setattr(metric, name, value)


def _holds_metrics(module: nn.Module) -> bool:
    # Through _modules, not modules(): that keeps a set of the modules it saw, and a
    # torchmetrics metric's hash is computed from its states (18 us for an AUROC holding
    # 100 batches, growing with them).
    for inner in module._modules.values():
        if inner is not None and ("_defaults" in vars(inner) or _holds_metrics(inner)):
            return True
    return False


def restore_metrics(metrics: dict[str, Any], saved: dict[str, Any]) -> None:
    # In place: a metric saved as its sums or its states gets them back, any other is
    # replaced by its copy.
    for name, metric in list(metrics.items()):
        value = saved[name]
        if isinstance(value, torch.Tensor):
            metric.total.copy_(value[0])
            metric.count.copy_(value[1])
        elif isinstance(value, _MetricStates):
            value.restore(metric)
        else:
            metrics[name] = value


def _clear_after_oom(state: State, batch: Any) -> None:
    state.batch, state.outputs, state.loss, state.total_loss = batch, None, None, None
    state.rank_loss = None
    state.parallelism.reset_after_oom(state.model)  # e.g. FSDP2's reset_iter_state()
    for optimizer in state.optimizers:
        optimizer.zero_grad(set_to_none=True)
    state.precision.reset_after_oom()
    free_after_oom(state)


def free_after_oom(state: State) -> None:
    gc.collect()
    if state.device.type == "cuda":
        torch.cuda.empty_cache()


def _halve_microbatch(state: State, batch: Any) -> None:
    assert state.train_data is not None
    current = state.device_train_microbatch_size or state.train_data.get_num_samples_in_batch(batch)
    if current <= 1:
        raise RuntimeError(
            "out of memory with device_train_microbatch_size=1: one sample does not fit on "
            f"{state.device}. Use a smaller model or sequence length, lower precision "
            "('amp_bf16'), activation checkpointing, or shard the model (FSDP)"
        )
    state.device_train_microbatch_size = current // 2
