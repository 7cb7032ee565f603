"""Evaluation in microbatches: ``device_eval_microbatch_size`` (an int, or ``"auto"``, which
halves on out-of-memory), on an `Evaluator` or as the Trainer's default."""

import pytest
import torch

from toy import EvalOOM, blobs, loader
from trainkit.core import Callback, Evaluator, Event
from trainkit.trainer import Trainer, TrainerConfig


def _trainer(model, **options):
    return Trainer(model=model, max_duration="1ba", progress_bar=False, device="cpu", **options)


def _eval(model, size, **options):
    evaluator = Evaluator(
        label="eval", data=loader(blobs(40), shuffle=False), device_eval_microbatch_size=size
    )
    trainer = _trainer(model, **options)
    metrics = trainer.eval(evaluator)
    count = int(trainer.state.eval_metrics["eval"]["accuracy"].count)
    return {k: float(v) for k, v in metrics.items()}, count, evaluator


def test_microbatches_give_the_whole_batches_metrics():
    whole, count, _ = _eval(EvalOOM(), None)
    assert count == 40
    model = EvalOOM()
    split, count, _ = _eval(model, 5)
    assert count == 40
    assert model.sizes == [5, 5, 5, 1] * 2 + [5, 3]  # batches of 16, 16, 8
    assert split == pytest.approx(whole, abs=1e-6)


def test_auto_halves_on_out_of_memory_and_keeps_the_size_it_found():
    whole, _, _ = _eval(EvalOOM(), None)
    model = EvalOOM(limit=6)
    metrics, count, evaluator = _eval(model, "auto")
    assert model.sizes[:4] == [16, 8, 4, 4]  # 16 and 8 run out of memory
    assert evaluator.auto_microbatching and evaluator.device_eval_microbatch_size == 4
    assert count == 40 and metrics == pytest.approx(whole, abs=1e-6)
    # The next evaluation starts at the size found.
    model.sizes.clear()
    _trainer(model).eval(evaluator)
    assert set(model.sizes) == {4}


def test_out_of_memory_after_some_microbatches_are_counted_counts_none_twice():
    whole, _, _ = _eval(EvalOOM(), None)
    # Call 1 (16) runs out of memory: size 8. Calls 2-3 evaluate batch 0, call 4 counts the
    # first half of batch 1, call 5 runs out of memory on its second half: the metrics go
    # back to before batch 1, which is evaluated again in 4s.
    model = EvalOOM(limit=8, fail_calls=(5,))
    metrics, count, evaluator = _eval(model, "auto")
    assert model.sizes[:9] == [16, 8, 8, 8, 8, 4, 4, 4, 4]
    assert evaluator.device_eval_microbatch_size == 4
    assert count == 40 and metrics == pytest.approx(whole, abs=1e-6)


def test_out_of_memory_without_auto_is_raised():
    with pytest.raises(torch.OutOfMemoryError):
        _eval(EvalOOM(limit=6), 8)


def test_one_sample_out_of_memory_says_what_to_try():
    with pytest.raises(RuntimeError, match=r"device_eval_microbatch_size=1: one sample does not"):
        _eval(EvalOOM(limit=0), "auto")


def test_torchmetrics_metrics_are_restored_after_out_of_memory():
    torchmetrics = pytest.importorskip("torchmetrics")

    class WithTorchmetrics(EvalOOM):
        def get_metrics(self, is_train=False):
            return {"accuracy": torchmetrics.classification.MulticlassAccuracy(2, average="micro")}

    trainer = _trainer(WithTorchmetrics())
    expected = float(trainer.eval(loader(blobs(40), shuffle=False))["metrics/eval/accuracy"])
    model = WithTorchmetrics(limit=8, fail_calls=(5,))
    trainer = _trainer(model)
    evaluator = Evaluator(
        label="eval", data=loader(blobs(40), shuffle=False), device_eval_microbatch_size="auto"
    )
    metrics = trainer.eval(evaluator)
    assert model.sizes[:5] == [16, 8, 8, 8, 8]
    assert float(metrics["metrics/eval/accuracy"]) == pytest.approx(expected, abs=1e-6)
    assert int(trainer.state.eval_metrics["eval"]["accuracy"].tp.sum()) == round(expected * 40)


class _Events(Callback):
    def __init__(self):
        self.seen = []

    def run_event(self, event, state, logger):
        if event.name.startswith("EVAL_") and ("BATCH" in event.name or "FORWARD" in event.name):
            self.seen.append((event, len(state.batch[0])))


def test_forward_events_fire_per_microbatch_and_batch_events_per_batch():
    events = _Events()
    trainer = _trainer(EvalOOM(), callbacks=[events], device_eval_microbatch_size=6)
    trainer.eval(loader(blobs(16), shuffle=False))
    assert events.seen == [
        (Event.EVAL_BATCH_START, 16),
        *[(Event.EVAL_BEFORE_FORWARD, 6), (Event.EVAL_AFTER_FORWARD, 6)] * 2,
        (Event.EVAL_BEFORE_FORWARD, 4),
        (Event.EVAL_AFTER_FORWARD, 4),
        (Event.EVAL_BATCH_END, 16),  # the whole batch again
    ]


def test_the_trainers_setting_is_the_default_for_evaluators_without_their_own():
    model = EvalOOM()
    own = Evaluator(label="own", data=loader(blobs(16)), device_eval_microbatch_size=8)
    plain = Evaluator(label="plain", data=loader(blobs(16)))
    trainer = _trainer(model, eval_dataloader=[own, plain], device_eval_microbatch_size="auto")
    assert own.device_eval_microbatch_size == 8 and not own.auto_microbatching
    assert plain.auto_microbatching
    trainer.eval()
    assert model.sizes == [8, 8, 16]
    # A loader given to eval() gets the default too.
    fixed = _trainer(model, device_eval_microbatch_size=4)
    model.sizes.clear()
    fixed.eval(loader(blobs(8)))
    assert model.sizes == [4, 4]


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "half"])
def test_a_bad_size_is_refused_naming_what_is_accepted(value):
    accepted = r"use a positive int, 'auto' \(halve on out-of-memory\), or None"
    with pytest.raises(
        ValueError, match=f"device_eval_microbatch_size .* is not valid; {accepted}"
    ):
        TrainerConfig(model=None, device_eval_microbatch_size=value)
    with pytest.raises(ValueError, match=f"evaluator 'x' device_eval_microbatch_size .*{accepted}"):
        Evaluator(label="x", data=loader(blobs(16)), device_eval_microbatch_size=value)
