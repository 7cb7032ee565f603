"""`HuggingFaceModel`: a transformers model as a `TrainModel`.

transformers is never imported here: the wrapper only calls the model, so it works with
any module that takes ``**batch`` and returns an output with ``loss`` and ``logits``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from trainkit.core._metrics import CrossEntropy, Perplexity
from trainkit.core._model import TrainModel

__all__ = ["HuggingFaceModel"]


class HuggingFaceModel(TrainModel):
    """Wraps a transformers model; batches are dicts of model inputs.

    The loss is the model's own (``outputs.loss``, computed when the batch has ``labels``).
    For causal language models, eval metrics default to token cross-entropy and perplexity
    on the shifted labels.

    Args:
        model: e.g. ``GPT2LMHeadModel(GPT2Config(...))``.
        tokenizer: kept for callbacks that generate text or save the run (optional).
        metrics: training metrics, by name, or a list (named by class, as Composer's
            ``metrics``); none by default.
        eval_metrics: eval metrics, by name or a list; ``update(logits, labels)`` is called
            on each. Default: cross-entropy and perplexity.
        shift_labels: compare logits at position t with labels at t+1 (causal LMs). By
            default true for models whose config says they are not encoder-decoder and
            whose class name ends in ``ForCausalLM`` / ``LMHeadModel``.
        use_logits: accepted for Composer scripts; metrics always receive the logits (what
            Composer passes with ``use_logits=True``).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        tokenizer: Any = None,
        metrics: Mapping[str, Any] | Sequence[Any] | None = None,
        eval_metrics: Mapping[str, Any] | Sequence[Any] | None = None,
        shift_labels: bool | None = None,
        use_logits: bool = True,
    ):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self._train_metrics = _by_name(metrics) if metrics is not None else {}
        if shift_labels is None:
            causal_name = type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))
            encoder_decoder = getattr(self.config, "is_encoder_decoder", False)
            shift_labels = causal_name and not encoder_decoder
        self.shift_labels = shift_labels
        self._eval_metrics = (
            _by_name(eval_metrics)
            if eval_metrics is not None
            else {"cross_entropy": CrossEntropy(), "perplexity": Perplexity()}
        )

    @property
    def config(self) -> Any:
        return getattr(self.model, "config", None)

    def forward(self, batch: Mapping[str, Any]) -> Any:
        if not isinstance(batch, Mapping):
            raise TypeError(
                f"HuggingFaceModel expects dict batches of model inputs (input_ids, "
                f"attention_mask, labels, ...), got {type(batch).__name__}"
            )
        return self.model(**batch)

    def loss(self, outputs: Any, batch: Mapping[str, Any]) -> torch.Tensor:
        loss = (
            outputs.get("loss") if isinstance(outputs, Mapping) else getattr(outputs, "loss", None)
        )
        if loss is None:
            raise ValueError(
                f"{type(self.model).__name__} returned no loss; include 'labels' in the batch "
                "or subclass HuggingFaceModel and override loss()"
            )
        return loss

    def get_metrics(self, is_train: bool = False) -> dict[str, Any]:
        return copy.deepcopy(self._train_metrics if is_train else self._eval_metrics)

    def update_metric(self, batch: Mapping[str, Any], outputs: Any, metric: Any) -> None:
        logits = outputs["logits"] if isinstance(outputs, Mapping) else outputs.logits
        labels = batch.get("labels")
        if labels is None:
            raise ValueError(
                f"the eval batch has no 'labels' (keys: {sorted(batch)}); eval metrics compare "
                "logits with labels, so include them in eval batches"
            )
        if self.shift_labels:
            logits, labels = logits[..., :-1, :], labels[..., 1:]
        metric.update(logits, labels)

    def loss_weight(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """Label tokens that count in the loss: the model's loss is a mean over them."""
        labels = batch["labels"]
        if self.shift_labels:
            labels = labels[..., 1:]
        return (labels != -100).sum()

    def flops_per_batch(self, batch: Mapping[str, Any]) -> float:
        """6 * parameters * tokens: forward and backward of a dense transformer."""
        params = sum(p.numel() for p in self.model.parameters())
        return 6.0 * params * batch["input_ids"].numel()


def _by_name(metrics: Mapping[str, Any] | Sequence[Any]) -> dict[str, Any]:
    if isinstance(metrics, Mapping):
        return dict(metrics)
    named = {type(m).__name__: m for m in metrics}
    if len(named) != len(metrics):
        raise ValueError(
            "two metrics of the same class in a list would share a name; pass a dict "
            "{name: metric} instead"
        )
    return named
