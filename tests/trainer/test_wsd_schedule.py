"""Warmup-stable-decay: the multiplier at chosen points against a reference computed here,
under scale_schedule_ratio, by name, in the Trainer, and bad options refused."""

import math
from dataclasses import dataclass, field

import pytest
import torch

from toy import blobs, loader, mlp
from trainkit.core import Callback, Time, Timestamp, ensure_time, plugins
from trainkit.trainer import Trainer
from trainkit.trainer.schedulers import WarmupStableDecayScheduler


@dataclass
class FakeState:
    """What a schedule reads from `State`."""

    max_duration: Time
    fraction: float
    dataloader_len: int | None = None
    timestamp: Timestamp = field(default_factory=Timestamp)

    def elapsed_fraction(self) -> float:
        return self.fraction


def reference(t: float, warmup: float, decay: float, total: float, alpha_f: float, shape: str):
    """WSD written out from its definition, on one axis (fractions or batches)."""
    if t < warmup:
        return t / warmup
    if t < total - decay:
        return 1.0
    p = min((t - (total - decay)) / decay, 1.0)
    return alpha_f + (1 - alpha_f) * (1 - (p if shape == "linear" else math.sqrt(p)))


@pytest.mark.parametrize("shape", ["linear", "1-sqrt"])
def test_wsd_matches_the_reference_at_chosen_points(shape):
    schedule = WarmupStableDecayScheduler(
        t_warmup="0.1dur", t_decay="0.25dur", alpha_f=0.1, decay_shape=shape
    )
    for t in (0.0, 0.05, 0.1, 0.3, 0.74, 0.75, 0.8, 0.9, 0.99, 1.0):
        state = FakeState(ensure_time("1000ba"), t)
        expected = reference(t, 0.1, 0.25, 1.0, 0.1, shape)
        assert schedule(state) == pytest.approx(expected), t
    # The shapes differ inside the decay: 1 - sqrt falls faster at first.
    mid = FakeState(ensure_time("1000ba"), 0.85)
    assert schedule(mid) == pytest.approx(
        0.1 + 0.9 * (1 - (0.4 if shape == "linear" else 0.4**0.5))
    )


def test_wsd_defaults_decay_linearly_to_zero_over_the_last_fifth():
    schedule = WarmupStableDecayScheduler(t_warmup="0.05dur")
    at = lambda t: schedule(FakeState(ensure_time("1ep"), t))  # noqa: E731
    assert at(0.025) == pytest.approx(0.5)
    assert at(0.5) == at(0.8) == 1.0
    assert at(0.9) == pytest.approx(0.5)
    assert at(1.0) == pytest.approx(0.0, abs=1e-12)


class LearningRates(Callback):
    def __init__(self):
        self.lrs: list[float] = []

    def batch_start(self, state, logger):
        self.lrs.append(state.optimizers[0].param_groups[0]["lr"])


def lrs_in_the_trainer(schedule, **options) -> list[float]:
    model = mlp(dropout=0.0)
    recorder = LearningRates()
    Trainer(
        model=model,
        train_dataloader=loader(blobs(64), batch_size=16),
        max_duration="20ba",
        optimizers=torch.optim.SGD(model.parameters(), lr=2.0),
        schedulers=schedule,
        callbacks=[recorder],
        progress_bar=False,
        device="cpu",
        seed=0,
        **options,
    ).fit()
    return recorder.lrs


@pytest.mark.parametrize("shape", ["linear", "1-sqrt"])
def test_wsd_in_the_trainer_in_batches(shape):
    schedule = WarmupStableDecayScheduler(t_warmup="4ba", t_decay="8ba", decay_shape=shape)
    lrs = lrs_in_the_trainer(schedule)
    assert lrs == pytest.approx([2.0 * reference(b, 4, 8, 20, 0.0, shape) for b in range(20)])


def test_wsd_under_scale_schedule_ratio_scales_decay_and_not_warmup():
    schedule = WarmupStableDecayScheduler(t_warmup="4ba", t_decay="8ba", t_max="20ba")
    lrs = lrs_in_the_trainer(schedule, scale_schedule_ratio=0.5)
    assert len(lrs) == 10
    assert lrs == pytest.approx([2.0 * reference(b, 4, 4, 10, 0.0, "linear") for b in range(10)])
    scaled = WarmupStableDecayScheduler(t_warmup="4ba", t_decay="8ba", scale_warmup=True)
    lrs = lrs_in_the_trainer(scaled, scale_schedule_ratio=0.5)
    assert lrs == pytest.approx([2.0 * reference(b, 2, 4, 10, 0.0, "linear") for b in range(10)])


def test_wsd_is_registered_by_name():
    assert plugins.load("trainkit.schedulers", "wsd") is WarmupStableDecayScheduler


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"decay_shape": "cosine"}, r"decay_shape must be one of 'linear', '1-sqrt', got 'cosine'"),
        ({"alpha_f": -0.5}, r"alpha_f must be a non-negative number, got -0.5"),
        ({"t_decay": "a fifth"}, r"t_decay"),
        ({"scale_warmup": "yes"}, r"scale_warmup must be True or False"),
    ],
)
def test_bad_wsd_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        WarmupStableDecayScheduler(t_warmup="0.1dur", **options)


def test_wsd_that_does_not_fit_in_t_max_is_refused_with_both_lengths():
    schedule = WarmupStableDecayScheduler(t_warmup="0.5dur", t_decay="0.6dur")
    with pytest.raises(ValueError, match=r"t_warmup 0.5dur plus t_decay 0.6dur is longer than"):
        schedule(FakeState(ensure_time("1ep"), 0.1))
    mixed = WarmupStableDecayScheduler(t_warmup="10ba", t_decay="1000tok", t_max="1dur")
    with pytest.raises(ValueError, match="measured differently"):
        mixed(FakeState(ensure_time("100ba"), 0.1))
