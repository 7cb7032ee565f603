"""`Classifier`: a module mapping inputs to class scores, as a `TrainModel`."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from trainkit.core import TrainModel
from trainkit.trainer.metrics import Accuracy, CrossEntropy

__all__ = ["Classifier"]

Metrics = Mapping[str, Any]


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
