"""Small metrics with the torchmetrics interface (update / compute / reset), synced across
ranks; torchmetrics objects work in their place.

trainkit-trainer ships the metrics its model wrappers need and two of Composer's (`LossMetric`,
`MaskedAccuracy`). Everything else comes from torchmetrics, which the Trainer uses as it
is (``pip install "trainkit-trainer[metrics]"`` installs it; the trainer never imports it): a model's
``get_metrics`` may return any ``torchmetrics.Metric``. Composer's BinaryF1, MIoU and Dice
are, in torchmetrics:

- BinaryF1: ``torchmetrics.classification.BinaryF1Score()``;
- MIoU: ``torchmetrics.classification.MulticlassJaccardIndex(num_classes, ignore_index=-1)``
  (intersections and unions summed over the whole set, then averaged over classes, as
  Composer's; Composer reports it times 100);
- Dice: ``torchmetrics.segmentation.DiceScore(num_classes, input_format="index")``
  (``include_background=False`` leaves class 0 out, as Composer's does; torchmetrics
  averages per image, or over the whole set with ``aggregation_level="global"``, where
  Composer averages per batch; it has no ignore index).

```python
from torchmetrics.classification import MulticlassJaccardIndex
from torchmetrics.segmentation import DiceScore

class Segmenter(TrainModel):
    def get_metrics(self, is_train=False):
        return {
            "miou": MulticlassJaccardIndex(num_classes=3, ignore_index=-1),
            "dice": DiceScore(num_classes=3, input_format="index"),
        }

    def update_metric(self, batch, outputs, metric):
        masks = batch[1]  # class indices (N, H, W), -1 where unlabelled
        if isinstance(metric, DiceScore):
            masks = masks.clamp_min(0)
        metric.update(outputs.argmax(dim=1), masks)
```

What the Trainer does with a metric, torchmetrics' or these: it moves it to the run's
device, ``reset()``s it before each evaluation (and each training epoch), passes each batch
through the model's ``update_metric(batch, outputs, metric)`` (default:
``metric.update(outputs, batch[1])``), logs ``compute()`` as ``metrics/<label>/<name>``,
and saves training metrics with the run (torchmetrics' states are made persistent for
that). ``compute()`` is collective: every rank calls it and gets the result over all
ranks' data (torchmetrics syncs its states; these sum their running totals), so results
are the same whatever the world size.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from trainkit.core import dist
from trainkit.core.plugins import name_hints

__all__ = [
    "Accuracy",
    "BitsPerToken",
    "CrossEntropy",
    "ExactMatch",
    "LossMetric",
    "MaskedAccuracy",
    "Mean",
    "Metric",
    "Perplexity",
]

# Composer's names for the same metrics (docs/coming-from-composer.md).
__getattr__ = name_hints(
    __name__,
    {
        "LanguageCrossEntropy": "Composer's LanguageCrossEntropy is "
        "trainkit.trainer.metrics.CrossEntropy (it skips ignore_index=-100 too)",
        "LanguagePerplexity": "Composer's LanguagePerplexity is trainkit.trainer.metrics.Perplexity",
    },
)


class Metric(nn.Module):
    """A metric kept as two running sums (``total``, ``count``) in persistent buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros((), dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    def _add(self, total: torch.Tensor, count: torch.Tensor | float) -> None:
        self.total += total.detach().to(self.total)
        self.count += count.detach().to(self.count) if isinstance(count, torch.Tensor) else count

    def _synced(self) -> tuple[torch.Tensor, torch.Tensor]:
        sums = dist.all_reduce(torch.stack([self.total, self.count]).clone(), "sum")
        return sums[0], sums[1]

    def compute(self) -> torch.Tensor:
        total, count = self._synced()
        return (total / count).float() if count > 0 else torch.tensor(float("nan"))

    def reset(self) -> None:
        self.total.zero_()
        self.count.zero_()

    def forward(self, *args: object, **kwargs: object) -> None:  # nn.Module requires it
        self.update(*args, **kwargs)

    def update(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError


class Mean(Metric):
    """Average of the values passed to `update` (scalars or tensors)."""

    def update(self, value: torch.Tensor | float) -> None:  # type: ignore[override]
        value = torch.as_tensor(value, dtype=torch.float64)
        self._add(value.sum(), value.numel())


class Accuracy(Metric):
    """Top-1 accuracy of class scores (N, C) against integer targets (N,)."""

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:  # type: ignore[override]
        if preds.ndim == target.ndim + 1:
            preds = preds.argmax(dim=-1)
        if preds.shape != target.shape:
            raise ValueError(
                f"Accuracy got predictions of shape {tuple(preds.shape)} and targets of shape "
                f"{tuple(target.shape)}; expected scores (N, C) or labels (N,) with targets (N,)"
            )
        self._add((preds == target).sum(), target.numel())


class CrossEntropy(Metric):
    """Mean cross-entropy of logits (..., C) against targets (...), skipping ``ignore_index``."""

    def __init__(self, ignore_index: int = -100) -> None:
        super().__init__()
        self.ignore_index = ignore_index

    def update(self, logits: torch.Tensor, target: torch.Tensor) -> None:  # type: ignore[override]
        logits = logits.reshape(-1, logits.shape[-1]).float()
        target = target.reshape(-1)
        loss = F.cross_entropy(logits, target, ignore_index=self.ignore_index, reduction="sum")
        self._add(loss, (target != self.ignore_index).sum())


class Perplexity(CrossEntropy):
    """exp(mean token cross-entropy)."""

    def compute(self) -> torch.Tensor:
        return torch.exp(super().compute())


class BitsPerToken(CrossEntropy):
    """Mean token cross-entropy in bits (bits per byte where each token is one byte)."""

    def compute(self) -> torch.Tensor:
        return super().compute() / math.log(2)


class MaskedAccuracy(Metric):
    """Top-1 accuracy over the positions whose target is not ``ignore_index``.

    For token predictions: scores (..., C) or labels (...) against targets (...), e.g.
    a masked language model's logits (N, S, V) against labels (N, S) holding -100 where
    no prediction is asked. Positions are counted, not samples.
    """

    def __init__(self, ignore_index: int = -100) -> None:
        super().__init__()
        self.ignore_index = ignore_index

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:  # type: ignore[override]
        given = tuple(preds.shape)
        if preds.ndim == target.ndim + 1:
            preds = preds.argmax(dim=-1)
        if preds.shape != target.shape:
            raise ValueError(
                f"MaskedAccuracy got predictions of shape {given} and targets of "
                f"shape {tuple(target.shape)}; expected scores (..., C) or labels (...) with "
                "targets (...)"
            )
        mask = target != self.ignore_index
        self._add((preds == target)[mask].sum(), mask.sum())


class LossMetric(Metric):
    """The mean of a loss function over everything evaluated, e.g. ``LossMetric(F.mse_loss)``.

    ``loss_function(preds, target)`` must return the mean over the batch (as torch's losses
    do by default). Each batch's value is weighted by its number of samples (``len(target)``),
    so the result is the mean over samples even when the last batch is smaller. (Composer's
    ``LossMetric`` averages batches with equal weights; both agree when all batches have
    the same size.)
    """

    def __init__(self, loss_function: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        super().__init__()
        if not callable(loss_function):
            raise TypeError(
                f"LossMetric needs a loss function (preds, target) -> loss, got "
                f"{type(loss_function).__name__}; e.g. LossMetric(torch.nn.functional.mse_loss)"
            )
        self.loss_function = loss_function

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:  # type: ignore[override]
        loss = torch.as_tensor(self.loss_function(preds, target))
        if loss.numel() != 1:
            raise ValueError(
                f"LossMetric's loss function returned a tensor of shape {tuple(loss.shape)}; "
                "it must return one value, the mean over the batch (reduction='mean')"
            )
        samples = len(target) if target.ndim > 0 else 1
        self._add(loss.reshape(()).double() * samples, float(samples))


class ExactMatch(Metric):
    """Share of generated texts equal to a reference answer, after normalising both.

    ``update(preds, target)``: ``preds`` a list of strings (e.g. what `HuggingFaceModel`
    generates for a batch with ``"mode": "generate"``), ``target`` one reference per
    prediction: a string, or a list of accepted strings (a match with any counts).
    Normalising collapses runs of whitespace to one space and strips the ends; with
    ``ignore_case`` it also case-folds. Counted per sample and summed over ranks.

    It declares ``takes_text = True``: `HuggingFaceModel.update_metric` passes text only
    to metrics that do. (Composer's generation exact-match for in-context learning also
    drops punctuation and articles and accepts a prediction that starts with the answer;
    this one compares whole strings, so generation should end at the answer, e.g. at EOS
    or with ``max_new_tokens``.)
    """

    takes_text = True

    def __init__(self, ignore_case: bool = False) -> None:
        super().__init__()
        self.ignore_case = ignore_case

    def _normalise(self, text: str) -> str:
        text = re.sub(r"\s+", " ", text).strip()
        return text.casefold() if self.ignore_case else text

    def update(  # type: ignore[override]
        self, preds: Sequence[str], target: Sequence[str | Sequence[str]]
    ) -> None:
        if isinstance(preds, str) or not all(isinstance(p, str) for p in preds):
            raise TypeError(
                f"ExactMatch expects a list of generated strings, got {type(preds).__name__}; "
                "use it with HuggingFaceModel on batches with 'mode': 'generate'"
            )
        if isinstance(target, str) or len(target) != len(preds):
            raise ValueError(
                f"ExactMatch got {len(preds)} predictions and "
                f"{'one string' if isinstance(target, str) else len(target)} references; "
                "expected a list with one reference (a string or a list of strings) per prediction"
            )
        hits = 0
        for pred, answers in zip(preds, target, strict=True):
            accepted = [answers] if isinstance(answers, str) else list(answers)
            if not all(isinstance(a, str) for a in accepted):
                raise TypeError(
                    f"ExactMatch references must be strings or lists of strings, got {answers!r}"
                )
            hits += self._normalise(pred) in {self._normalise(a) for a in accepted}
        self._add(torch.tensor(float(hits)), float(len(preds)))
