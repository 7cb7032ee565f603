"""A NaN or infinite training loss stops the run with an error naming the batch, or warns
once when the run was told to train on."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from toy import blobs, loader, mlp
from trainkit.core import Callback, TrainModel
from trainkit.trainer import NonFiniteLossError, Trainer, TrainerConfig
from trainkit.trainer._nonfinite import LossWatch


class BadLossAt(TrainModel):
    """A classifier whose loss is multiplied by ``factor`` (nan, inf) at batch ``batch``
    (counted from 1), on rank ``rank`` only when given."""

    def __init__(self, batch: int, factor: float, rank: int | None = None):
        super().__init__()
        self.inner = mlp(dropout=0.0)
        self.batch, self.factor, self.rank, self.calls = batch, factor, rank, 0

    def forward(self, batch):
        return self.inner(batch)

    def loss(self, outputs, batch):
        self.calls += 1
        loss = self.inner.loss(outputs, batch)
        here = self.rank is None or torch.distributed.get_rank() == self.rank
        return loss * self.factor if self.calls == self.batch and here else loss


class Checkpoints(Callback):
    """Records the batches whose BATCH_CHECKPOINT fired (where a checkpointer saves)."""

    def __init__(self):
        self.batches = []

    def batch_checkpoint(self, state, logger):
        self.batches.append(state.timestamp.batch)


def _trainer(model, **options) -> Trainer:
    return Trainer(
        model=model,
        train_dataloader=loader(blobs(64), shuffle=False),
        max_duration="8ba",
        progress_bar=False,
        device="cpu",
        seed=3,
        **options,
    )


@pytest.mark.parametrize("factor", [math.nan, math.inf, -math.inf])
def test_a_non_finite_loss_stops_the_run_naming_the_batch_before_it_is_checkpointed(factor):
    checkpoints = Checkpoints()
    run = _trainer(BadLossAt(5, factor), callbacks=[checkpoints])
    with pytest.raises(
        NonFiniteLossError, match=rf"loss of batch 5 \(counted from 1\) is {factor}"
    ) as caught:
        run.fit()
    assert caught.value.batch == 5
    assert math.isnan(caught.value.value) if math.isnan(factor) else caught.value.value == factor
    assert checkpoints.batches == [1, 2, 3, 4]  # the bad batch never reached BATCH_CHECKPOINT
    assert run.state.timestamp.batch == 5


def test_warn_trains_on_and_warns_once():
    checkpoints = Checkpoints()
    run = _trainer(BadLossAt(3, math.nan), callbacks=[checkpoints], on_nonfinite_loss="warn")
    with pytest.warns(RuntimeWarning, match=r"loss of batch 3 \(counted from 1\) is nan") as caught:
        run.fit()
    assert len([w for w in caught if "training loss" in str(w.message)]) == 1
    assert checkpoints.batches == list(range(1, 9))
    assert run.state.timestamp.batch == 8


def test_finite_losses_train_without_a_word():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        run = _trainer(BadLossAt(3, 1.0))
        run.fit()
    assert run.state.timestamp.batch == 8


def test_on_nonfinite_loss_must_be_a_known_choice():
    with pytest.raises(
        ValueError, match=r"on_nonfinite_loss='ignore' is not a choice; use 'error'"
    ):
        TrainerConfig(model=mlp(), on_nonfinite_loss="ignore")


def test_the_loss_watch_keeps_the_first_bad_batch():
    watch = LossWatch()
    for batch, loss in enumerate([1.0, 2.0, math.inf, math.nan, 3.0], start=1):
        watch.update(torch.tensor(loss), batch)
    assert watch.first() == (3, math.inf)


@pytest.mark.gpu
def test_the_loss_watch_on_cuda_reads_without_waiting_and_keeps_the_first_bad_batch():
    watch = LossWatch()
    for batch, loss in enumerate([1.0, 2.0, math.inf, math.nan, 3.0], start=1):
        watch.update(torch.tensor(loss, device="cuda"), batch)
    torch.cuda.synchronize()
    seen = watch.first()  # the copy may still be the one taken before batch 3
    assert seen in (None, (3, math.inf))
    assert watch.first(wait=True) == (3, math.inf)
