"""`Logger`: fan-out to destinations, and a failing destination does not stop training."""

import warnings

import pytest
import torch
from torch import nn

from toy import blobs, loader, mlp
from trainkit.core import Logger, LoggerDestination, State, Timestamp
from trainkit.trainer import Trainer


class Memory(LoggerDestination):
    def __init__(self):
        self.calls = []

    def log_hyperparameters(self, hyperparameters):
        self.calls.append(("hparams", hyperparameters))

    def log_metrics(self, metrics, step):
        self.calls.append(("metrics", dict(metrics), step))

    def log_images(self, name, images, step):
        self.calls.append(("images", name, step))

    def upload_file(self, name, path, overwrite=False):
        self.calls.append(("upload", name, str(path), overwrite))

    def close(self):
        self.calls.append(("close",))


class Broken(LoggerDestination):
    def __init__(self):
        self.attempts = 0

    def log_metrics(self, metrics, step):
        self.attempts += 1
        raise OSError("disk full")

    def close(self):
        raise OSError("still full")


class MetricsOnly(LoggerDestination):
    """Overrides only log_metrics; the rest are the base class's no-ops."""

    def __init__(self):
        self.steps = []

    def log_metrics(self, metrics, step):
        self.steps.append(step)


def logger_warnings(record):
    return [w for w in record if "logger destination" in str(w.message)]


def test_everything_fans_out_to_every_destination():
    first, second = Memory(), Memory()
    logger = Logger([first, second])
    logger.log_hyperparameters({"lr": 0.1})
    logger.log_metrics({"loss": 1.5}, step=3)
    logger.log_images("samples", torch.zeros(1, 3, 2, 2), step=4)
    logger.upload_file("ckpt", "/tmp/x.pt", overwrite=True)
    logger.close()
    expected = [
        ("hparams", {"lr": 0.1}),
        ("metrics", {"loss": 1.5}, 3),
        ("images", "samples", 4),
        ("upload", "ckpt", "/tmp/x.pt", True),
        ("close",),
    ]
    assert first.calls == expected
    assert second.calls == expected


def test_hyperparameters_are_passed_as_a_copy():
    memory = Memory()
    hyperparameters = {"lr": 0.1}
    Logger([memory]).log_hyperparameters(hyperparameters)
    hyperparameters["lr"] = 0.2
    assert memory.calls == [("hparams", {"lr": 0.1})]


def test_step_defaults_to_the_global_batch():
    state = State(model=nn.Linear(1, 1), timestamp=Timestamp(batch=17))
    memory = Memory()
    Logger([memory], state).log_metrics({"x": 1})
    Logger([memory]).log_metrics({"x": 2})
    assert memory.calls == [("metrics", {"x": 1}, 17), ("metrics", {"x": 2}, 0)]


def test_destinations_that_override_one_method_get_no_ops_for_the_rest():
    partial, memory = MetricsOnly(), Memory()
    logger = Logger([partial, memory])
    logger.log_images("im", torch.zeros(1, 1, 1, 1), step=1)
    logger.log_metrics({"a": 1}, step=5)
    logger.close()
    assert partial.steps == [5]
    assert [c[0] for c in memory.calls] == ["images", "metrics", "close"]


def test_failing_destination_warns_once_and_others_still_receive():
    broken, memory = Broken(), Memory()
    logger = Logger([broken, memory])
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        logger.log_metrics({"loss": 1.0}, step=1)
        logger.log_metrics({"loss": 0.5}, step=2)
        logger.close()
    found = logger_warnings(record)
    assert len(found) == 1
    assert found[0].category is RuntimeWarning
    assert "Broken.log_metrics" in str(found[0].message)
    assert "disk full" in str(found[0].message)
    assert broken.attempts == 2  # it keeps being called
    assert [c for c in memory.calls if c[0] == "metrics"] == [
        ("metrics", {"loss": 1.0}, 1),
        ("metrics", {"loss": 0.5}, 2),
    ]


def test_each_failing_destination_warns_once():
    logger = Logger([Broken(), Broken()])
    with pytest.warns(RuntimeWarning) as record:
        logger.log_metrics({"a": 1}, step=0)
        logger.log_metrics({"a": 1}, step=1)
    assert len(logger_warnings(record)) == 2


def test_training_continues_when_a_destination_fails():
    broken, memory = Broken(), Memory()
    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(64)),
        max_duration="4ba",
        loggers=[broken, memory],
        progress_bar=False,
        device="cpu",
        seed=0,
    )
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer.fit()
        trainer.close()
    assert trainer.state.timestamp.batch == 4
    assert len(logger_warnings(record)) == 1
    assert broken.attempts >= 4
    steps = [c[2] for c in memory.calls if c[0] == "metrics" and "loss/train/total" in c[1]]
    assert steps == [1, 2, 3, 4]
