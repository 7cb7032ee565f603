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
ranks' data (torchmetrics syncs its states; these sum their running totals).
"""

from trainkit.trainer._metrics import (
    Accuracy,
    BitsPerToken,
    CrossEntropy,
    ExactMatch,
    LossMetric,
    MaskedAccuracy,
    Mean,
    Metric,
    Perplexity,
)

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
