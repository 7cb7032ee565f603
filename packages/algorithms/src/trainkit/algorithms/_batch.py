"""Reading and replacing the inputs or targets of a batch, whatever its container.

Batches are ``(inputs, targets)`` tuples or lists (keys are positions) or dicts (keys are
names). Data methods take ``input_key`` / ``target_key`` and go through these helpers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["get_item", "index_batch", "interpolate_loss", "set_item"]

Key = int | str


def get_item(batch: Any, key: Key, method: str) -> Any:
    """``batch[key]``, with an error naming the method when the batch has no such item."""
    try:
        return batch[key]
    except (KeyError, IndexError, TypeError) as err:
        shape = sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__
        raise ValueError(
            f"{method} looks for item {key!r} in the batch, which has none ({shape}); set "
            "input_key / target_key to where the batch keeps its inputs and targets"
        ) from err


def set_item(batch: Any, key: Key, value: Any) -> Any:
    """A batch like ``batch`` with ``batch[key]`` replaced; tuples are rebuilt, not mutated."""
    if isinstance(batch, Mapping):
        return {**batch, key: value}
    items = list(batch)
    items[key] = value  # type: ignore[index]
    return type(batch)(items) if isinstance(batch, tuple | list) else items


def index_batch(batch: Any, index: torch.Tensor) -> Any:
    """The samples ``index`` of every tensor in the batch (along dim 0); other items kept."""
    if isinstance(batch, torch.Tensor):
        return batch[index]
    if isinstance(batch, Mapping):
        return {k: index_batch(v, index) for k, v in batch.items()}
    if isinstance(batch, tuple | list):
        return type(batch)(index_batch(v, index) for v in batch)
    return batch


def interpolate_loss(state: Any, target_key: Key, permuted_targets: Any, mixing: float) -> None:
    """``state.loss = lerp(loss(y), loss(y[perm]), mixing)``, for methods that mix inputs.

    Runs at AFTER_LOSS: the model's own loss against the permuted targets, under the run's
    precision, interpolated with the loss the loop computed against the original targets.
    """
    permuted = set_item(state.batch, target_key, permuted_targets)
    model = state.parallelism.unwrap(state.model)
    with state.precision.autocast():
        other = model.loss(state.outputs, permuted)
    assert state.loss is not None
    state.loss = torch.lerp(state.loss, other.to(state.loss.dtype), mixing)
