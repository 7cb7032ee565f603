"""swa: the model takes the mean of the weights from swa_start at swa_end, the learning rate
anneals as SWALR, batch norm is re-estimated, and a resumed run is exact."""

import copy

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import SWALR

from toy import blobs, flat_params, loader, mlp
from trainkit.algorithms import SWA, SWAConfig, recompute_batchnorm
from trainkit.algorithms.swa import swa_learning_rate
from trainkit.core import Algorithm, Callback, Event, plugins
from trainkit.trainer import Classifier, Trainer
from trainkit.trainer.schedulers import LinearScheduler


class Record(Algorithm):
    """Listed before SWA: sees each batch's weights before SWA (BATCH_END runs in list order)."""

    def __init__(self):
        self.weights, self.lrs = [], []

    def match(self, event, state):
        return event in (Event.BEFORE_FORWARD, Event.BATCH_END)

    def apply(self, event, state, logger):
        if event == Event.BEFORE_FORWARD:
            self.lrs.append(state.optimizers[0].param_groups[0]["lr"])
        else:
            self.weights.append(flat_params(state.model).clone())


def make(swa, algorithms=(), callbacks=(), model=None, **kwargs):
    model = model or mlp(dropout=0.0)
    return Trainer(
        model=model,
        train_dataloader=loader(blobs(128)),
        max_duration=kwargs.pop("max_duration", "8ba"),
        optimizers=torch.optim.SGD(model.parameters(), lr=0.5),
        algorithms=[*algorithms, swa],
        callbacks=list(callbacks),
        progress_bar=False,
        device="cpu",
        seed=3,
        **kwargs,
    )


def swalr_rates(lr, swa_lr, anneal_steps, strategy, updates):
    """Torch's SWALR, stepped once per update: the rate after each of ``updates`` updates."""
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = SWALR(
        optimizer, swa_lr=swa_lr, anneal_epochs=anneal_steps, anneal_strategy=strategy
    )
    rates = []
    for _ in range(updates):
        optimizer.step()
        scheduler.step()
        rates.append(optimizer.param_groups[0]["lr"])
    return rates


@pytest.mark.parametrize("strategy", ["linear", "cos"])
def test_learning_rate_is_torch_swalr(strategy):
    expected = swalr_rates(0.5, 0.05, 3, strategy, 5)
    ours = [
        swa_learning_rate(0.5, j, swa_lr=0.05, anneal_steps=3, anneal_strategy=strategy)
        for j in range(1, 6)
    ]
    assert ours == pytest.approx(expected, rel=1e-12)
    assert swa_learning_rate(0.5, 0, swa_lr=0.05) == 0.5


def test_model_takes_the_mean_at_swa_end_with_the_annealed_learning_rate():
    record = Record()
    swa = SWA(
        swa_start="0.5dur", swa_end="1dur", update_interval="2ba", swa_lr=0.05, anneal_steps=2
    )
    trainer = make(swa, [record])
    trainer.fit()
    # Update events from batch 4 (elapsed 0.5): updates after batches 4, 6 and 8.
    expected = torch.stack([record.weights[i] for i in (3, 5, 7)]).mean(0)
    torch.testing.assert_close(flat_params(trainer.state.model), expected)
    after_one, after_two = swalr_rates(0.5, 0.05, 2, "linear", 2)
    assert record.lrs == pytest.approx([0.5] * 4 + [after_one] * 2 + [after_two] * 2)
    assert swa.applied and swa.count == 3


def test_swa_end_before_the_end_swaps_in_the_average_and_training_goes_on_from_it():
    record, plain = Record(), Record()
    starts = []

    class AtStart(Callback):
        def batch_start(self, state, logger):
            starts.append(flat_params(state.model).clone())

    swa = SWA(swa_start="0.25dur", swa_end="0.5dur", update_interval="1ba", swa_lr=0.05)
    schedule = LinearScheduler(alpha_f=0.2)
    trainer = make(swa, [record], [AtStart()], schedulers=[schedule])
    trainer.fit()
    average = torch.stack([record.weights[i] for i in (1, 2, 3)]).mean(0)  # after batches 2-4
    torch.testing.assert_close(starts[4], average)  # batch 5 starts from the average
    assert swa.applied and swa.count == 3
    # Annealing from batch 3 (after the first update) to the swap; then the run's schedule.
    make(SWA(swa_start="100ba", swa_end="200ba"), [plain], schedulers=[schedule]).fit()
    initial = plain.lrs[2]  # the schedule's rate when the first update happened
    annealed = [swa_learning_rate(initial, j, swa_lr=0.05) for j in (1, 2)]
    assert record.lrs == pytest.approx(plain.lrs[:2] + annealed + plain.lrs[4:])
    assert not torch.equal(flat_params(trainer.state.model), average)


def test_epoch_interval():
    record = Record()
    trainer = make(SWA(swa_start="0.4dur", swa_end="1dur"), [record], max_duration="3ep")
    trainer.fit()  # 8 batches per epoch; epoch ends at elapsed 1/3, 2/3 and 1
    expected = torch.stack([record.weights[i] for i in (15, 23)]).mean(0)
    torch.testing.assert_close(flat_params(trainer.state.model), expected)


def test_run_ending_before_swa_end_still_ends_on_the_average():
    record = Record()
    trainer = make(SWA(swa_start="2ba", swa_end="20ba", update_interval="1ba"), [record])
    trainer.fit()
    expected = torch.stack(record.weights[1:]).mean(0)
    torch.testing.assert_close(flat_params(trainer.state.model), expected)


def test_batchnorm_statistics_are_recomputed_for_the_average():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    trainer = make(
        SWA(swa_start="0.5dur", swa_end="1dur", update_interval="1ba"),
        model=Classifier(net, num_classes=2),
    )
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
    def swa():
        return SWA(swa_start="0.25dur", swa_end="1dur", update_interval="1ba", swa_lr=0.1)

    full = make(swa())
    full.fit()

    class StopAt6(Callback):
        def batch_end(self, state, logger):
            if state.timestamp.batch == 6:
                state.stop_training()  # an interrupted run: max_duration stays 8ba

    first = make(swa(), callbacks=[StopAt6()])
    first.fit()
    saved = copy.deepcopy(first.state.state_dict())
    resumed = make(swa())
    resumed.state.load_state_dict(saved)
    resumed.fit()
    assert torch.equal(flat_params(resumed.state.model), flat_params(full.state.model))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"swa_start": "1.5dur"}, r"swa_start must be within \[0dur, 1dur\], got '1.5dur'"),
        ({"swa_start": "0.8dur", "swa_end": "0.5dur"}, "swa_end must come after swa_start"),
        ({"swa_start": "2ep", "swa_end": "0.9dur"}, "in the same unit"),
        ({"swa_start": "10sp"}, "must be a fraction of training, epochs or batches"),
        ({"update_interval": "0.5dur"}, "must be a positive number of epochs or batches"),
        ({"update_interval": "often"}, "update_interval 'often' is not a duration"),
        ({"swa_lr": 0.0}, "swa_lr must be positive, got 0.0"),
        ({"anneal_strategy": "cosine"}, "anneal_strategy must be 'linear' or 'cos', got 'cosine'"),
        ({"anneal_steps": 0}, "anneal_steps must be an int of at least 1, got 0"),
        ({"bn_batches": 0}, "bn_batches must be at least 1, got 0"),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SWAConfig(**kwargs)


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "swa") is SWA
