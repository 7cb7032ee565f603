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
from trainkit.core import plugins
from trainkit.trainer import Classifier, Trainer


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


def composer_stop(values, patience, min_delta=0.0, lower_is_better=False):
    """Composer's rule, written out: the check (1-based) at which training stops, or None.
    ``patience`` is in checks (one check per batch here); it stops when strictly more than
    ``patience`` has passed since the best value."""
    best = best_at = None
    for check, value in enumerate(values, start=1):
        if best is None:
            better = True
        else:
            better = value < best - min_delta if lower_is_better else value > best + min_delta
        if better:
            best, best_at = value, check
        if check - best_at > patience:
            return check
    return None


@pytest.mark.parametrize(
    "values",
    [
        [0.5, 0.6, 0.6, 0.55, 0.58, 0.9, 0.9],
        [0.5, 0.6, 0.6, 0.55, 0.9, 0.9, 0.9, 0.9, 0.9],
        [0.9, 0.8, 0.7, 0.6, 0.5],
    ],
)
def test_stops_as_composer_once_more_than_patience_has_passed(values):
    values = values + [values[-1]] * (10 - len(values))  # the metric holds its last value
    stopper = EarlyStopper(monitor="score", patience="2ba")
    expected = composer_stop(values, patience=2)
    assert expected is not None
    assert run(stopper, values) == expected
    assert stopper.best == pytest.approx(max(values[:expected]))


def test_min_delta_and_inferred_min_mode():
    # "loss" is minimised; improvements of less than 0.1 do not count.
    stopper = EarlyStopper(monitor="loss", min_delta=0.1, patience="2ba")
    assert stopper.mode == "min" and stopper.config.mode is None  # the config keeps what was given
    values = [1.0, 0.95, 0.5, 0.45, 0.42, 0.41, 0.3, 0.3, 0.3, 0.3]
    expected = composer_stop(values, patience=2, min_delta=0.1, lower_is_better=True)
    assert expected == 6  # 0.45, 0.42, 0.41 are within min_delta of 0.5
    assert run(stopper, values) == expected


def test_overriding_the_monitor_infers_the_mode_again():
    config = EarlyStopperConfig(monitor="accuracy")
    assert EarlyStopper(config).mode == "max"
    assert EarlyStopper(config, monitor="loss").mode == "min"
    assert ThresholdStopper(monitor="perplexity", threshold=3.0).mode == "min"


@pytest.mark.parametrize("patience", [2, "2ep"])
def test_an_int_patience_counts_epochs_as_composer(patience):
    # 2 batches per epoch; the train metric is checked at each epoch end (epochs 1, 2, ...);
    # never improving after epoch 1, it stops at the first epoch more than 2 later: epoch 4.
    stopper = EarlyStopper(monitor="score", dataloader_label="train", patience=patience)
    assert run(stopper, [0.1] * 20, label="train", max_duration="10ep") == 2 * 4


def test_composer_positional_order_and_comp_strings():
    stopper = EarlyStopper("score", "eval", "lt", 0.05, "3ba")
    assert stopper.config == EarlyStopperConfig(
        monitor="score", dataloader_label="eval", mode="lt", min_delta=0.05, patience="3ba"
    )
    assert stopper.mode == "min"
    threshold = ThresholdStopper("score", "train", 0.9, stop_on_batch=True)
    assert (threshold.config.monitor, threshold.config.dataloader_label) == ("score", "train")
    assert threshold.config.threshold == 0.9 and threshold.mode == "max"
    with pytest.raises(TypeError, match="two values for 'monitor'"):
        EarlyStopper("score", monitor="loss")
    with pytest.raises(TypeError, match="at most 3 positional arguments"):
        ThresholdStopper("score", "eval", 0.9, "gt")


def test_never_stops_while_improving():
    assert run(EarlyStopper(monitor="score", patience=1), [0.1 * i for i in range(1, 20)]) == 10


def test_state_survives_a_resume():
    stopper = EarlyStopper(monitor="score", patience=3)
    stopper.best, stopper.best_at, stopper.checks = 0.7, 2, 4
    other = EarlyStopper(monitor="score", patience=3)
    other.load_state_dict(stopper.state_dict())
    assert (other.best, other.best_at, other.checks) == (0.7, 2, 4)


def test_threshold_stopper_stops_once_beyond_the_threshold_as_composer():
    # Strictly beyond, as Composer's torch.greater / torch.less (values exact in float32).
    assert run(ThresholdStopper(monitor="score", threshold=0.75), [0.1, 0.5, 0.75, 0.8, 0.95]) == 4
    assert run(ThresholdStopper(monitor="loss", threshold=0.25), [0.9, 0.5, 0.25, 0.19]) == 4
    assert run(ThresholdStopper(monitor="score", threshold=0.5, mode="min"), [0.9, 0.7, 0.49]) == 3


def test_threshold_stopper_on_a_train_metric_every_batch():
    values = [0.1, 0.2, 0.95, 0.97]
    per_epoch = ThresholdStopper(monitor="score", dataloader_label="train", threshold=0.9)
    per_batch = ThresholdStopper(
        monitor="score", dataloader_label="train", threshold=0.9, stop_on_batch=True
    )
    # The train metric's k-th value holds through epoch k (2 batches each): at each epoch
    # end it first passes 0.9 at the end of epoch 3 (batch 6); checked every batch, at the
    # first batch of epoch 3 (batch 5).
    assert run(per_epoch, values, label="train", max_duration="10ep") == 6
    assert run(per_batch, values, label="train", max_duration="10ep") == 5


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
