"""early_stopper and threshold_stopper: training stops exactly when the watched metric says so."""

import pytest
import torch
from torch import nn

from toy import blobs, loader
from trainkit.algorithms import (
    EarlyStopper,
    EarlyStopperConfig,
    ThresholdStopper,
    ThresholdStopperConfig,
)
from trainkit.core import Classifier, Trainer, plugins


class Scripted:
    """A metric whose value at the k-th evaluation is values[k] (reset starts an evaluation)."""

    def __init__(self, values):
        self.values, self.resets = list(values), 0

    def update(self, outputs, targets):
        pass

    def reset(self):
        self.resets += 1

    def compute(self):
        return torch.tensor(self.values[min(self.resets, len(self.values)) - 1])

    def to(self, device):
        return self


def run(callback, values, label="eval", max_duration="10ba"):
    torch.manual_seed(0)
    metrics = {"score": Scripted(values), "loss": Scripted(values)}
    model = Classifier(nn.Linear(8, 2), num_classes=2, eval_metrics=metrics, train_metrics=metrics)
    trainer = Trainer(
        model=model,
        train_dataloader=loader(blobs(32)),
        eval_dataloader=loader(blobs(16)),
        eval_interval="1ba",
        max_duration=max_duration,
        callbacks=[callback],
        progress_bar=False,
        device="cpu",
    )
    trainer.fit()
    return trainer.state.timestamp.batch


def test_stops_after_patience_checks_without_improvement():
    stopper = EarlyStopper(monitor="score", patience=2)
    assert run(stopper, [0.5, 0.6, 0.6, 0.55, 0.9, 0.9]) == 4
    assert stopper.best == pytest.approx(0.6)


def test_min_delta_and_inferred_min_mode():
    # "loss" is minimised; improvements of less than 0.1 do not count.
    stopper = EarlyStopper(monitor="loss", min_delta=0.1, patience=2)
    assert stopper.mode == "min" and stopper.config.mode is None  # the config keeps what was given
    assert run(stopper, [1.0, 0.95, 0.5, 0.45, 0.42, 0.1]) == 5


def test_overriding_the_monitor_infers_the_mode_again():
    config = EarlyStopperConfig(monitor="accuracy")
    assert EarlyStopper(config).mode == "max"
    assert EarlyStopper(config, monitor="loss").mode == "min"
    assert ThresholdStopper(monitor="perplexity", threshold=3.0).mode == "min"


def test_patience_as_time_and_train_metrics():
    # 2 batches per epoch; the train metric is checked at each epoch end; patience 2 epochs.
    stopper = EarlyStopper(monitor="score", dataloader_label="train", patience="2ep")
    assert run(stopper, [0.1] * 20, label="train", max_duration="10ep") == 2 * 3


def test_never_stops_while_improving():
    assert run(EarlyStopper(monitor="score", patience=1), [0.1 * i for i in range(1, 20)]) == 10


def test_state_survives_a_resume():
    stopper = EarlyStopper(monitor="score", patience=3)
    stopper.best, stopper.best_at, stopper.checks = 0.7, 2, 4
    other = EarlyStopper(monitor="score", patience=3)
    other.load_state_dict(stopper.state_dict())
    assert (other.best, other.best_at, other.checks) == (0.7, 2, 4)


def test_threshold_stopper_stops_when_reached():
    assert run(ThresholdStopper(monitor="score", threshold=0.8), [0.1, 0.5, 0.79, 0.8, 0.95]) == 4
    assert run(ThresholdStopper(monitor="loss", threshold=0.2), [0.9, 0.5, 0.19, 0.1]) == 3
    assert run(ThresholdStopper(monitor="score", threshold=0.5, mode="min"), [0.9, 0.7, 0.5]) == 3


def test_unknown_metric_or_label_fails_before_training():
    with pytest.raises(
        Exception,
        match="watches metric 'accuracy', which 'eval' does not compute; available: loss, score",
    ):
        run(EarlyStopper(monitor="accuracy"), [0.1])
    with pytest.raises(
        Exception, match="watches dataloader_label 'val', which this run does not have"
    ):
        run(ThresholdStopper(monitor="score", threshold=0.5, dataloader_label="val"), [0.1])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: EarlyStopperConfig(monitor="acc", mode="up"),
            "mode 'up' is not one of 'max', 'min'",
        ),
        (lambda: EarlyStopperConfig(monitor="acc", min_delta=-1), "min_delta must be non-negative"),
        (lambda: EarlyStopperConfig(monitor="acc", patience=0), "patience must be a positive int"),
        (
            lambda: EarlyStopperConfig(monitor="acc", patience="0.5dur"),
            "must be a positive number of epochs or batches",
        ),
        (
            lambda: ThresholdStopperConfig(monitor="acc", threshold=float("nan")),
            "threshold must be a finite number",
        ),
    ],
)
def test_bad_config(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_entry_points():
    assert plugins.load("trainkit.callbacks", "early_stopper") is EarlyStopper
    assert plugins.load("trainkit.callbacks", "threshold_stopper") is ThresholdStopper
