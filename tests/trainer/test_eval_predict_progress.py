"""``state.eval_timestamp`` and ``state.predict_timestamp`` count an evaluation's and a
prediction's batches and samples, as Composer's; ``predict`` takes ``subset_num_batches``."""

import pytest

from toy import blobs, loader, mlp
from trainkit.core import Callback, Evaluator
from trainkit.trainer import Trainer


class Progress(Callback):
    def __init__(self):
        self.eval, self.predict = [], []

    def eval_start(self, state, logger):
        self.eval.append((state.dataloader_label, int(state.eval_timestamp.batch)))

    def eval_batch_end(self, state, logger):
        ts = state.eval_timestamp
        self.eval.append((state.dataloader_label, int(ts.batch), int(ts.sample)))

    def predict_batch_end(self, state, logger):
        ts = state.predict_timestamp
        self.predict.append((int(ts.batch), int(ts.sample)))


def _trainer(**options):
    progress = Progress()
    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(32)),
        max_duration="2ba",
        progress_bar=False,
        device="cpu",
        seed=0,
        callbacks=[progress],
        **options,
    )
    return trainer, progress


def test_eval_timestamp_counts_each_evaluation_from_zero():
    evaluators = [
        Evaluator(label="a", data=loader(blobs(40), batch_size=16)),
        Evaluator(label="b", data=loader(blobs(10), batch_size=8), device_eval_microbatch_size=3),
    ]
    trainer, progress = _trainer(eval_dataloader=evaluators, eval_interval="1ba")
    trainer.fit()
    one_round = [
        ("a", 0), ("a", 1, 16), ("a", 2, 32), ("a", 3, 40),
        ("b", 0), ("b", 1, 8), ("b", 2, 10),
    ]  # fmt: skip
    assert progress.eval == one_round * 2  # after batch 1 and batch 2
    assert trainer.state.eval_timestamp.batch == 2  # the last evaluator's


def test_predict_timestamp_and_a_subset_of_batches():
    trainer, progress = _trainer()
    outputs = trainer.predict(loader(blobs(40), batch_size=16, shuffle=False))
    assert len(outputs) == 3 and progress.predict == [(1, 16), (2, 32), (3, 40)]
    progress.predict.clear()
    outputs = trainer.predict(loader(blobs(40), batch_size=16), subset_num_batches=2)
    assert len(outputs) == 2 and progress.predict == [(1, 16), (2, 32)]
    assert len(trainer.predict(loader(blobs(40), batch_size=16), -1)) == 3  # Composer's "all"
    with pytest.raises(ValueError, match="subset_num_batches must be a positive number"):
        trainer.predict(loader(blobs(40)), subset_num_batches=0)


def test_a_prediction_that_fails_leaves_the_model_training():
    class Fails(Callback):
        def predict_before_forward(self, state, logger):
            raise RuntimeError("bad batch")

    trainer, _ = _trainer()
    trainer.state.callbacks.append(Fails())
    with pytest.raises(Exception, match="bad batch"):
        trainer.predict(loader(blobs(16)))
    assert trainer.state.model.training  # as it was before predict
