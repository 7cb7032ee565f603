"""`DataSpec(batch_transforms=..., microbatch_transforms=...)`, as Composer's: the first on
each batch as the loader yields it (before counting and the device), the second on each
microbatch on the device, just before its forward; in training, evaluation and prediction."""

import pytest
import torch

from toy import blobs, loader, mlp
from trainkit.core import Callback, DataSpec, Evaluator
from trainkit.trainer import Trainer


class Seen(Callback):
    def __init__(self):
        self.yielded, self.forwards, self.eval_forwards, self.predicted = [], [], [], []

    def after_dataloader(self, state, logger):
        self.yielded.append(len(state.batch[0]))

    def before_forward(self, state, logger):
        self.forwards.append(float(state.batch[0].abs().sum()) == 0.0)

    def eval_before_forward(self, state, logger):
        self.eval_forwards.append((len(state.batch[0]), float(state.batch[0].abs().sum()) == 0.0))

    def predict_before_forward(self, state, logger):
        self.predicted.append((len(state.batch[0]), float(state.batch[0].abs().sum()) == 0.0))


def _first_half(batch):
    x, y = batch
    return x[: len(x) // 2], y[: len(y) // 2]


def _zeroed(batch):
    x, y = batch
    return torch.zeros_like(x), y  # a new batch: the given one is left as it was


def _spec(dataset, batch_size=16):
    return DataSpec(
        loader(dataset, batch_size=batch_size),
        batch_transforms=_first_half,
        microbatch_transforms=_zeroed,
    )


def test_transforms_in_training_evaluation_and_prediction():
    seen = Seen()
    trainer = Trainer(
        model=mlp(),
        train_dataloader=_spec(blobs(64)),
        eval_dataloader=Evaluator(
            label="eval", data=_spec(blobs(32)), device_eval_microbatch_size=3
        ),
        max_duration="2ba",
        device_train_microbatch_size=4,
        progress_bar=False,
        device="cpu",
        seed=0,
        callbacks=[seen],
    )
    trainer.fit()
    assert seen.yielded == [8, 8]  # halved as yielded, before the events
    assert trainer.state.timestamp.sample == 16  # counted after the batch transform
    assert seen.forwards == [True] * 4  # 2 microbatches of 4 a batch, each zeroed
    # Evaluation: 2 batches of 16 -> 8 -> microbatches of 3, 3, 2, each zeroed.
    assert seen.eval_forwards == [(3, True), (3, True), (2, True)] * 2
    assert trainer.state.eval_timestamp.sample == 16
    outputs = trainer.predict(_spec(blobs(32)))
    assert seen.predicted == [(8, True), (8, True)] and [len(o) for o in outputs] == [8, 8]


def test_without_transforms_batches_are_as_the_loader_yields_them():
    seen = Seen()
    trainer = Trainer(
        model=mlp(),
        train_dataloader=DataSpec(loader(blobs(64))),
        max_duration="1ba",
        progress_bar=False,
        device="cpu",
        callbacks=[seen],
    )
    trainer.fit()
    assert seen.yielded == [16] and seen.forwards == [False]


@pytest.mark.parametrize("name", ["batch_transforms", "microbatch_transforms"])
def test_a_transform_that_is_not_a_function_is_refused(name):
    with pytest.raises(TypeError, match=f"{name} must be a function batch -> batch, got str"):
        DataSpec(loader(blobs(16)), **{name: "normalize"})
