"""swa: the model ends on the mean of the weights from swa_start, with batch norm re-estimated."""

import copy

import pytest
import torch
from torch import nn

from toy import blobs, flat_params, loader, mlp
from trainkit.algorithms import SWA, SWAConfig, recompute_batchnorm
from trainkit.core import Callback, Classifier, Trainer, plugins


class Snapshots(Callback):
    def __init__(self):
        self.weights, self.lrs = [], []

    def before_forward(self, state, logger):
        self.lrs.append(state.optimizer.param_groups[0]["lr"])

    def batch_end(self, state, logger):
        self.weights.append(flat_params(state.model).clone())


def make(swa, callbacks=(), model=None, **kwargs):
    model = model or mlp(dropout=0.0)
    return Trainer(
        model=model,
        train_dataloader=loader(blobs(128)),
        max_duration=kwargs.pop("max_duration", "8ba"),
        optimizers=torch.optim.SGD(model.parameters(), lr=0.5),
        algorithms=[swa],
        callbacks=list(callbacks),
        progress_bar=False,
        device="cpu",
        seed=3,
        **kwargs,
    )


def test_model_ends_on_the_mean_of_the_late_weights_at_the_swa_lr():
    snaps = Snapshots()
    trainer = make(SWA(swa_start=0.5, update_interval="2ba", swa_lr=0.05), [snaps])
    trainer.fit()
    # Added after batches 4, 6 and 8 (elapsed >= 0.5, every second batch).
    expected = torch.stack([snaps.weights[i] for i in (3, 5, 7)]).mean(0)
    torch.testing.assert_close(flat_params(trainer.state.model), expected)
    # The learning rate is swa_lr from half-way (batch 5 starts at elapsed 0.5).
    assert snaps.lrs == [0.5] * 4 + [0.05] * 4


def test_epoch_interval():
    snaps = Snapshots()
    trainer = make(SWA(swa_start=0.4), [snaps], max_duration="3ep")  # 8 batches per epoch
    trainer.fit()
    expected = torch.stack([snaps.weights[i] for i in (15, 23)]).mean(0)
    torch.testing.assert_close(flat_params(trainer.state.model), expected)


def test_batchnorm_statistics_are_recomputed_for_the_average():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    trainer = make(SWA(swa_start=0.5, update_interval="1ba"), model=Classifier(net, num_classes=2))
    trainer.fit()
    x, _ = blobs(128)[:]
    with torch.no_grad():
        features = net[0](x)
    torch.testing.assert_close(net[1].running_mean, features.mean(0), rtol=1e-4, atol=1e-5)
    assert net[1].momentum == 0.1


def test_recompute_batchnorm_without_batchnorm_reads_nothing():
    def boom():
        raise AssertionError("read")
        yield

    assert recompute_batchnorm(nn.Linear(2, 2), boom()) == 0


def test_resume_is_exact():
    full = make(SWA(swa_start=0.5, update_interval="1ba"))
    full.fit()

    class StopAt6(Callback):
        def batch_end(self, state, logger):
            if state.timestamp.batch == 6:
                state.stop_training()  # an interrupted run: max_duration stays 8ba

    first = make(SWA(swa_start=0.5, update_interval="1ba"), [StopAt6()])
    first.fit()
    saved = copy.deepcopy(first.state.state_dict())
    resumed = make(SWA(swa_start=0.5, update_interval="1ba"))
    resumed.state.load_state_dict(saved)
    resumed.fit()
    assert torch.equal(flat_params(resumed.state.model), flat_params(full.state.model))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"swa_start": 1.0}, r"swa_start must be in \[0, 1\), got 1.0"),
        ({"update_interval": "0.5dur"}, "must be a positive number of epochs or batches"),
        ({"update_interval": "often"}, "update_interval 'often' is not a duration"),
        ({"swa_lr": 0.0}, "swa_lr must be positive, got 0.0"),
        ({"bn_batches": 0}, "bn_batches must be at least 1, got 0"),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SWAConfig(**kwargs)


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "swa") is SWA
