"""`TrainModel`: what the loop needs from a model; `PretrainedWrapper`: a model around a
transformers model, as checkpointing and text generation recognise it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

__all__ = ["PretrainedWrapper", "TrainModel", "repeated_blocks"]


class TrainModel(nn.Module):
    """An `nn.Module` that knows its loss and metrics.

    Subclasses implement ``forward(batch)`` and ``loss(outputs, batch)``. The rest has
    defaults: ``eval_forward`` runs ``forward``; there are no metrics unless
    ``get_metrics`` returns some; ``update_metric`` calls ``metric.update(outputs, targets)``
    with the batch's second element. Metrics follow the torchmetrics interface.

    A model whose loss is a mean over something other than samples (tokens, pixels) may
    define ``loss_weight(batch)``: how many items of that kind a batch holds. Gradient
    accumulation then weights microbatches by it, and data-parallel ranks are weighted by
    it too, so the gradient equals one process's on the whole step's batch.

    A model built on the meta device may define ``load_weights()``: called once the run has
    placed (and sharded) it and initialised it (`trainkit.core.meta`), before a checkpoint
    resumes; where it reads pretrained weights into its shards.
    """

    loss_weight: Callable[[Any], Any] | None = None
    """``loss_weight(batch)``, for a loss that is a mean over something other than samples
    (see above); None: microbatches and ranks are weighted by their samples."""

    def forward(self, batch: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement forward(batch)")

    def loss(self, outputs: Any, batch: Any) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement loss(outputs, batch)")

    def eval_forward(self, batch: Any, outputs: Any | None = None) -> Any:
        """Outputs used for evaluation metrics; ``outputs`` from training are reused if given."""
        return outputs if outputs is not None else self(batch)

    def get_metrics(self, is_train: bool = False) -> dict[str, Any]:
        """Fresh metric objects by name; the Trainer keeps its own copies."""
        return {}

    def update_metric(self, batch: Any, outputs: Any, metric: Any) -> None:
        metric.update(outputs, batch[1])


@runtime_checkable
class PretrainedWrapper(Protocol):
    """A model that wraps a transformers ``PreTrainedModel`` and keeps its tokenizer.

    What checkpoints (the ``config.json`` saved beside the weights, export with
    ``save_pretrained``) and text generation (the `Generate` callback) need from a model;
    trainkit-trainer's `HuggingFaceModel` is one, and so is any module with these two
    attributes (``isinstance(model, PretrainedWrapper)`` checks that they exist).
    """

    model: nn.Module
    """The transformers model: it has ``config`` and ``save_pretrained`` (and, for a causal
    language model, ``generate``)."""
    tokenizer: Any
    """Its tokenizer, or None."""


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of ``model``, deepest first: children of a ModuleList that share
    one class. What FSDP shards and activation checkpointing wraps by default.

    That is how Hugging Face transformers (``model.transformer.h``, ``model.model.layers``)
    and most hand-written transformers hold their layers.
    """
    blocks: list[nn.Module] = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 1:
            classes = {type(child) for child in module}
            if len(classes) == 1:
                blocks.extend(module)
    # A block inside another block (nested ModuleLists) must be handled first.
    order = {id(m): i for i, m in enumerate(reversed(list(model.modules())))}
    return sorted(blocks, key=lambda m: order[id(m)])
