"""What the per-step fast paths must keep: metrics across out-of-memory retries, no parsing
per step, callbacks seen when added mid-run."""

import pytest
import torch

from toy import blobs, loader, mlp
from trainkit.core import Callback, Time, TrainModel
from trainkit.trainer import Trainer
from trainkit.trainer import _retry as retry_module
from trainkit.trainer.schedulers import LinearWithWarmupScheduler


class OOMInLoss(TrainModel):
    """Runs forward (so the train metrics are updated), then runs out of memory in the
    loss for microbatches larger than ``limit``."""

    def __init__(self, limit: int, metrics=None) -> None:
        super().__init__()
        self.limit = limit
        self.inner = mlp(dropout=0.0)
        self._metrics = metrics

    def forward(self, batch):
        return self.inner(batch)

    def loss(self, outputs, batch):
        if batch[0].shape[0] > self.limit:
            raise torch.OutOfMemoryError(f"fake OOM: {batch[0].shape[0]} > {self.limit}")
        return self.inner.loss(outputs, batch)

    def get_metrics(self, is_train=False):
        return self._metrics() if self._metrics is not None else self.inner.get_metrics(is_train)

    def update_metric(self, batch, outputs, metric):
        self.inner.update_metric(batch, outputs, metric)


class CountingMetric:
    """Not a trainkit Metric (no running-sum buffers): saved by copying the whole object."""

    def __init__(self) -> None:
        self.samples = 0

    def update(self, outputs, targets) -> None:
        self.samples += targets.shape[0]

    def compute(self):
        return torch.tensor(float(self.samples))

    def reset(self) -> None:
        self.samples = 0

    def to(self, device):
        return self


def _fit(model, **kwargs):
    trainer = Trainer(
        model=model,
        train_dataloader=loader(blobs(64), shuffle=False),
        max_duration="1ep",
        device="cpu",
        seed=0,
        progress_bar=False,
        **kwargs,
    )
    trainer.fit()
    return trainer


def test_out_of_memory_retries_count_each_sample_once_in_the_train_metrics():
    retried = _fit(OOMInLoss(limit=4), device_train_microbatch_size="auto")
    assert retried.state.device_train_microbatch_size == 4
    plain = _fit(OOMInLoss(limit=64))
    accuracy = retried.state.train_metrics["accuracy"]
    assert int(accuracy.count) == 64  # not 64 plus the failed attempts' samples
    torch.testing.assert_close(accuracy.compute(), plain.state.train_metrics["accuracy"].compute())


def test_out_of_memory_retries_restore_other_metrics_whole():
    model = OOMInLoss(limit=4, metrics=lambda: {"seen": CountingMetric()})
    model.update_metric = lambda batch, outputs, metric: metric.update(outputs, batch[1])
    trainer = _fit(model, device_train_microbatch_size="auto")
    assert trainer.state.train_metrics["seen"].samples == 64


def _torchmetrics():
    torchmetrics = pytest.importorskip("torchmetrics")
    classification = torchmetrics.classification
    return {
        "accuracy": classification.MulticlassAccuracy(2, average="micro"),  # tensor states
        "auroc": classification.MulticlassAUROC(2, thresholds=None),  # list states: every row
    }


def test_torchmetrics_are_restored_after_out_of_memory_from_their_states(monkeypatch):
    # Copying a torchmetrics metric whole every batch cost ~360 us (accuracy) and, for one
    # that keeps every prediction, grew with the batches seen (AUROC: ~5 ms after 100).
    def update(batch, outputs, metric):
        metric.update(outputs, batch[1])

    plain = OOMInLoss(limit=64, metrics=_torchmetrics)
    plain.update_metric = update
    expected = {k: m.compute() for k, m in _fit(plain).state.train_metrics.items()}

    deepcopy = retry_module.copy.deepcopy

    def no_metric_copies(value, memo=None):
        if isinstance(value, pytest.importorskip("torchmetrics").Metric):
            raise AssertionError(f"{type(value).__name__} was copied whole")
        return deepcopy(value, memo)

    monkeypatch.setattr(retry_module.copy, "deepcopy", no_metric_copies)
    retried = OOMInLoss(limit=4, metrics=_torchmetrics)
    retried.update_metric = update
    trainer = _fit(retried, device_train_microbatch_size="auto")
    assert trainer.state.device_train_microbatch_size == 4
    metrics = trainer.state.train_metrics
    assert int(metrics["accuracy"].tp.sum() + metrics["accuracy"].fn.sum()) == 64
    assert sum(len(preds) for preds in metrics["auroc"].preds) == 64  # no failed attempt's
    for name, value in expected.items():
        torch.testing.assert_close(metrics[name].compute(), value)


def test_a_torchmetrics_wrapper_is_restored_whole_after_out_of_memory():
    # MinMaxMetric is a Metric whose update() updates the metric it wraps: saving only its
    # own states would leave the inner metric counting the failed attempts too.
    wrappers = pytest.importorskip("torchmetrics.wrappers")
    classification = pytest.importorskip("torchmetrics.classification")

    def metrics():
        return {"minmax": wrappers.MinMaxMetric(classification.MulticlassAccuracy(2))}

    def update(batch, outputs, metric):
        metric.update(outputs, batch[1])

    plain = OOMInLoss(limit=64, metrics=metrics)
    plain.update_metric = update
    expected = _fit(plain).state.train_metrics["minmax"].compute()
    retried = OOMInLoss(limit=4, metrics=metrics)
    retried.update_metric = update
    trainer = _fit(retried, device_train_microbatch_size="auto")
    assert trainer.state.device_train_microbatch_size == 4
    wrapper = trainer.state.train_metrics["minmax"]
    inner = wrapper._base_metric
    assert int(inner.tp.sum() + inner.fn.sum()) == 64
    torch.testing.assert_close(wrapper.compute(), expected)


def test_no_time_string_is_parsed_per_step(monkeypatch):
    model = mlp()
    trainer = Trainer(
        model=model,
        train_dataloader=loader(blobs(64)),
        eval_dataloader=loader(blobs(16)),
        eval_interval="3ba",
        max_duration="8ba",
        schedulers=LinearWithWarmupScheduler(t_warmup="0.25dur"),
        device="cpu",
        seed=0,
        progress_bar=False,
    )
    parsed: list[str] = []
    original = Time.from_timestring.__func__

    def counting(cls, text):
        parsed.append(text)
        return original(cls, text)

    monkeypatch.setattr(Time, "from_timestring", classmethod(counting))
    trainer.fit(duration="2ba")
    after_two = len(parsed)
    trainer.fit(duration="6ba")
    assert len(parsed) - after_two <= after_two  # per fit at most, not per batch
    assert len(parsed) <= 2 * after_two


@pytest.mark.parametrize("when", ["before_fit", "mid_run"])
def test_a_callback_added_later_is_called(when):
    calls: list[int] = []

    class Counter(Callback):
        def batch_end(self, state, logger):
            calls.append(state.timestamp.batch)

    class AddsCounter(Callback):
        def batch_end(self, state, logger):
            if state.timestamp.batch == 1:
                state.callbacks.append(Counter())

    callbacks = [AddsCounter()] if when == "mid_run" else []
    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(64)),
        max_duration="3ba",
        device="cpu",
        progress_bar=False,
        callbacks=callbacks,
    )
    if when == "before_fit":
        trainer.state.callbacks.append(Counter())
    trainer.fit()
    assert calls == ([1, 2, 3] if when == "before_fit" else [2, 3])
