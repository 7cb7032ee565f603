"""`TrainModel`: what the loop needs from a model, and the `Classifier` wrapper."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from trainkit.core._metrics import Accuracy, CrossEntropy

__all__ = ["Classifier", "TrainModel"]

Metrics = Mapping[str, Any]


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


class Classifier(TrainModel):
    """Wraps a module mapping inputs to class scores; batches are ``(inputs, targets)``.

    Args:
        module: the network; ``module(inputs)`` returns scores of shape (N, num_classes).
        num_classes: number of classes, used to check outputs (optional).
        loss_fn: ``(scores, targets) -> loss``; cross-entropy by default.
        train_metrics / eval_metrics: metric objects by name (default: accuracy, and
            cross-entropy for eval).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        num_classes: int | None = None,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
        train_metrics: Metrics | None = None,
        eval_metrics: Metrics | None = None,
    ):
        super().__init__()
        if num_classes is not None and num_classes < 2:
            raise ValueError(f"num_classes must be at least 2, got {num_classes}")
        self.module = module
        self.num_classes = num_classes
        self.loss_fn = loss_fn
        self._train_metrics = (
            dict(train_metrics) if train_metrics is not None else {"accuracy": Accuracy()}
        )
        self._eval_metrics = (
            dict(eval_metrics)
            if eval_metrics is not None
            else {"accuracy": Accuracy(), "cross_entropy": CrossEntropy()}
        )

    def forward(self, batch: Any) -> torch.Tensor:
        inputs = batch[0] if isinstance(batch, list | tuple) else batch
        scores = self.module(inputs)
        if self.num_classes is not None and scores.shape[-1] != self.num_classes:
            raise ValueError(
                f"{type(self.module).__name__} returned scores of shape {tuple(scores.shape)}, "
                f"but num_classes={self.num_classes}"
            )
        return scores

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return self.loss_fn(outputs, batch[1])

    def get_metrics(self, is_train: bool = False) -> dict[str, Any]:
        return copy.deepcopy(self._train_metrics if is_train else self._eval_metrics)


def optional_method(model: nn.Module, name: str) -> Callable[..., Any] | None:
    """``model.<name>`` where the model defines it (on its class, or set on the instance),
    else None. Asked per batch: a plain ``getattr(model, name, None)`` on a module without
    it goes through ``nn.Module.__getattr__``, which raises and catches an AttributeError
    (~790 ns against ~210 here, measured on 2 CPU cores)."""
    if getattr(type(model), name, None) is None and name not in vars(model):
        return None
    return getattr(model, name)
