"""selective_backprop: the configured share of low-loss samples is dropped, in the window only."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from toy import blobs, loader, mlp
from trainkit.algorithms import (
    CutOut,
    SelectiveBackprop,
    SelectiveBackpropConfig,
    per_sample_losses,
    select_high_loss,
    should_select,
)
from trainkit.core import Callback, Engine, Event, Logger, State, Trainer, plugins


def test_select_high_loss_keeps_the_highest_in_order():
    batch = (torch.arange(6.0).unsqueeze(1), torch.arange(6))
    losses = torch.tensor([0.1, 5.0, 0.2, 3.0, 4.0, 0.3])
    (x, y), kept = select_high_loss(batch, losses, keep=0.5)
    assert (
        kept.tolist() == [1, 3, 4]
        and y.tolist() == [1, 3, 4]
        and x.squeeze(1).tolist() == [1, 3, 4]
    )
    dict_batch, _ = select_high_loss({"input_ids": torch.arange(6).view(6, 1)}, losses, keep=0.34)
    assert dict_batch["input_ids"].view(-1).tolist() == [1, 4]


def test_schedule():
    selected = [should_select(b / 10, b, start=0.2, end=0.8, interrupt=3) for b in range(10)]
    assert selected == [False, False, False, True, True, False, True, True, False, False]
    assert should_select(0.5, 2, start=0.0, end=1.0, interrupt=0)


def test_default_per_sample_losses_match_unreduced_cross_entropy():
    model = mlp(dropout=0.0)
    x, y = blobs(8)[:]
    outputs = model((x, y))
    expected = F.cross_entropy(outputs, y, reduction="none")
    torch.testing.assert_close(per_sample_losses(model, outputs, (x, y)), expected)


class Check(Callback):
    """Runs after the algorithms at BATCH_START: compares with losses scored independently."""

    def __init__(self, algorithm):
        self.algorithm, self.raw, self.sizes = algorithm, None, []

    def after_dataloader(self, state, logger):
        self.raw = state.batch

    def batch_start(self, state, logger):
        x, y = self.raw
        self.sizes.append(state.batch[0].shape[0])
        if self.algorithm.kept is None:
            assert torch.equal(state.batch[0], x)
            return
        with torch.no_grad():
            losses = F.cross_entropy(state.model((x, y)), y, reduction="none")
        kept = set(self.algorithm.kept.tolist())
        dropped = [i for i in range(len(y)) if i not in kept]
        assert min(losses[list(kept)]) >= max(
            losses[dropped]
        )  # the kept ones are the high-loss ones
        assert torch.equal(state.batch[0], x[sorted(kept)])


def test_trainer_drops_the_low_loss_fraction_in_the_window():
    sb = SelectiveBackprop(start=0.25, end=0.75, keep=0.25, interrupt=2)
    check = Check(sb)
    Trainer(
        model=mlp(dropout=0.0),
        train_dataloader=loader(blobs(128)),
        max_duration="8ba",
        algorithms=[sb],
        callbacks=[check],
        progress_bar=False,
        device="cpu",
        device_train_microbatch_size=2,
    ).fit()
    # Batches 2..5 (0-based) are in the window; every second of them (3, 5) is whole.
    assert check.sizes == [16, 16, 4, 16, 4, 16, 16, 16]


def test_runs_first_whatever_its_place_in_the_list():
    log = []

    class LoggedSelectiveBackprop(SelectiveBackprop):
        def apply(self, event, state, logger):
            log.append("selective_backprop")

    class LoggedCutOut(CutOut):
        def apply(self, event, state, logger):
            log.append("cutout")

    assert SelectiveBackprop.order == "first"
    state = State(model=nn.Linear(1, 1), algorithms=[LoggedCutOut(), LoggedSelectiveBackprop()])
    Engine(state, Logger([], state)).run_event(Event.BATCH_START)
    assert log == ["selective_backprop", "cutout"]


def test_custom_per_sample_loss_and_model_without_per_sample_outputs():
    with pytest.raises(ValueError, match="needs outputs with the samples along dim 0"):
        per_sample_losses(mlp(), torch.tensor(1.0), (torch.zeros(2, 8), torch.zeros(2)))
    calls = []

    def loss(outputs, batch):
        calls.append(outputs.shape[0])
        return F.cross_entropy(outputs, batch[1], reduction="none")

    Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(32)),
        max_duration="2ba",
        algorithms=[SelectiveBackprop(start=0.0, end=1.0, interrupt=0, per_sample_loss=loss)],
        progress_bar=False,
        device="cpu",
    ).fit()
    assert calls == [16, 16]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start": 0.9, "end": 0.5}, "start and end must satisfy 0 <= start < end <= 1"),
        ({"keep": 0.0}, r"keep must be in \(0, 1\], got 0.0"),
        ({"interrupt": -1}, "interrupt must be a non-negative int, got -1"),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SelectiveBackpropConfig(**kwargs)


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "selective_backprop") is SelectiveBackprop
