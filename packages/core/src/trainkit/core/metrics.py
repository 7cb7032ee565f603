"""Small metrics with the torchmetrics interface (update / compute / reset), synced across
ranks; torchmetrics objects work in their place."""

from trainkit.core._metrics import Accuracy, CrossEntropy, Mean, Metric, Perplexity

__all__ = ["Accuracy", "CrossEntropy", "Mean", "Metric", "Perplexity"]
