"""selective_backprop: samples drawn by loss percentile, scored on downscaled inputs, in the window."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from toy import blobs, loader, mlp
from trainkit.algorithms import (
    CutOut,
    SelectiveBackprop,
    SelectiveBackpropConfig,
    per_sample_losses,
    select_high_loss,
    should_select,
)
from trainkit.algorithms.selective_backprop import downscale, selection_probabilities
from trainkit.core import Callback, Engine, Event, Logger, State, plugins
from trainkit.trainer import Classifier, Trainer


def test_rank_weights_are_the_loss_percentile_to_the_power_one_over_keep_minus_one():
    for n, keep in ((6, 0.5), (5, 0.25), (7, 0.8)):
        reference = [((i + 0.5) / n) ** (1 / keep - 1) for i in range(n)]
        total = sum(reference)
        expected = torch.tensor([w / total for w in reference], dtype=torch.float64)
        torch.testing.assert_close(selection_probabilities(n, keep), expected)


def exact_inclusion(probs, count):
    """P(rank i is drawn) when ``count`` ranks are drawn one by one without replacement."""
    inclusion = [0.0] * len(probs)
    for order in itertools.permutations(range(len(probs)), count):
        chance, left = 1.0, 1.0
        for rank in order:
            chance *= probs[rank] / left
            left -= probs[rank]
        for rank in order:
            inclusion[rank] += chance
    return inclusion


def test_draw_is_without_replacement_with_the_paper_probabilities():
    losses = torch.tensor([0.3, 2.0, 0.1, 1.0, 0.7])  # ranks (ascending): 2, 0, 4, 3, 1
    keep, draws = 0.4, 6000
    probs = [((i + 0.5) / 5) ** (1 / keep - 1) for i in range(5)]
    probs = [p / sum(probs) for p in probs]
    by_rank = exact_inclusion(probs, 2)
    expected = torch.tensor([by_rank[r] for r in (1, 4, 0, 3, 2)])  # per sample, via its rank
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(5)
    for _ in range(draws):
        (x,), kept = select_high_loss((torch.arange(5.0),), losses, keep=keep, generator=generator)
        assert kept.tolist() == sorted(set(kept.tolist())) and len(kept) == 2  # no repeats
        assert torch.equal(x, kept.float())
        counts[kept] += 1
    torch.testing.assert_close(counts / draws, expected, atol=0.025, rtol=0)
    # The lowest-loss sample is rarely kept, the highest most often: not a top-k.
    assert 0 < counts[2] < counts[0] < counts[4] < counts[3] < counts[1]


def test_count_is_floor_of_keep_times_n_and_at_least_one():
    losses = torch.arange(10.0)
    assert len(select_high_loss(losses, losses, keep=0.35)[1]) == 3
    assert len(select_high_loss(losses, losses, keep=0.05)[1]) == 1
    assert select_high_loss(losses, losses, keep=1.0)[1].tolist() == list(range(10))
    dict_batch, kept = select_high_loss(
        {"input_ids": torch.arange(10).view(10, 1)}, losses, keep=0.5
    )
    assert dict_batch["input_ids"].view(-1).tolist() == kept.tolist()


def test_schedule_counts_batches_in_the_epoch():
    selected = [should_select(b / 10, b, start=0.2, end=0.8, interrupt=3) for b in range(10)]
    assert selected == [False, False, False, True, True, False, True, True, False, False]
    assert should_select(0.5, 2, start=0.0, end=1.0, interrupt=0)
    assert not should_select(0.5, 0, start=0.0, end=1.0, interrupt=0, keep=1.0)  # nothing to cut


def test_downscale_matches_interpolate():
    x = torch.rand(2, 3, 8, 8)
    expected = F.interpolate(x, size=(4, 4), mode="bilinear", align_corners=False)
    torch.testing.assert_close(downscale(x, 0.5), expected)
    assert downscale(torch.rand(2, 3, 8), 0.5).shape == (2, 3, 4)
    assert downscale(x, 1.0) is x
    with pytest.raises(
        ValueError, match=r"scale_factor resizes inputs shaped .* got shape \(2, 8\)"
    ):
        downscale(torch.rand(2, 8), 0.5)


def test_default_per_sample_losses_match_unreduced_cross_entropy():
    model = mlp(dropout=0.0)
    x, y = blobs(8)[:]
    outputs = model((x, y))
    expected = F.cross_entropy(outputs, y, reduction="none")
    torch.testing.assert_close(per_sample_losses(model, outputs, (x, y)), expected)


class Check(Callback):
    """Runs after the algorithms at BATCH_START: the batch is the kept rows of the loaded one."""

    def __init__(self, algorithm):
        self.algorithm, self.raw, self.sizes = algorithm, None, []

    def after_dataloader(self, state, logger):
        self.raw = state.batch

    def batch_start(self, state, logger):
        x, _ = self.raw
        self.sizes.append(state.batch[0].shape[0])
        kept = self.algorithm.kept
        assert torch.equal(state.batch[0], x if kept is None else x[kept])


def test_trainer_keeps_the_configured_share_in_the_window():
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


def test_scoring_pass_sees_downscaled_images_and_the_step_full_ones():
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.rand(32, 3, 8, 8, generator=g), torch.randint(0, 3, (32,), generator=g)
    )
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)
    )
    shapes, scored = [], []

    def loss(outputs, batch):
        scored.append(batch[0])
        return F.cross_entropy(outputs, batch[1], reduction="none")

    class Raw(Callback):
        def after_dataloader(self, state, logger):
            self.x = state.batch[0]

        def before_forward(self, state, logger):
            shapes.append(tuple(state.batch[0].shape))

    raw = Raw()
    sb = SelectiveBackprop(
        start=0.0, end=1.0, keep=0.5, interrupt=0, scale_factor=0.5, per_sample_loss=loss
    )
    Trainer(
        model=Classifier(net, num_classes=3),
        train_dataloader=loader(data, shuffle=False),
        max_duration="1ba",
        algorithms=[sb],
        callbacks=[raw],
        progress_bar=False,
        device="cpu",
    ).fit()
    expected = F.interpolate(raw.x, size=(4, 4), mode="bilinear", align_corners=False)
    torch.testing.assert_close(scored[0], expected)
    assert shapes == [(8, 3, 8, 8)]


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
        ({"scale_factor": 1.5}, r"scale_factor must be in \(0, 1\], got 1.5"),
        ({"interrupt": -1}, "interrupt must be a non-negative int, got -1"),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SelectiveBackpropConfig(**kwargs)


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "selective_backprop") is SelectiveBackprop
