"""layer_freezing: trainable parameters shrink on schedule and frozen layers stop changing."""

import copy

import pytest
import torch
from torch import nn

from toy import blobs, loader
from trainkit.algorithms import LayerFreezing, LayerFreezingConfig, freeze_layers, frozen_fraction
from trainkit.core import Callback, Classifier, Trainer, plugins


def deep(seed=0):
    torch.manual_seed(seed)
    layers = [
        nn.Linear(8, 8),
        nn.ReLU(),
        nn.Linear(8, 8),
        nn.ReLU(),
        nn.Linear(8, 8),
        nn.ReLU(),
        nn.Linear(8, 2),
    ]
    return Classifier(nn.Sequential(*layers), num_classes=2)


def trainable(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_schedule():
    assert frozen_fraction(0.25, freeze_start=0.5) == 0.0
    assert frozen_fraction(0.75, freeze_start=0.5) == 0.5
    assert frozen_fraction(1.0, freeze_start=0.5, freeze_level=0.5) == 0.5


def test_freeze_layers_freezes_the_earliest_layers():
    model = deep()
    assert freeze_layers(model, 0.5) == 2
    assert [p.requires_grad for p in model.parameters()] == [False] * 4 + [True] * 4


def test_trainer_reduces_trainable_parameters_on_schedule():
    counts, weights = [], []

    class Count(Callback):
        def batch_end(self, state, logger):
            counts.append(trainable(state.model))
            weights.append(copy.deepcopy(state.model.module[0].weight.detach()))

    model = deep()
    Trainer(
        model=model,
        train_dataloader=loader(blobs(128)),
        max_duration="8ba",
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        algorithms=[LayerFreezing(freeze_start=0.5, freeze_level=1.0)],
        callbacks=[Count()],
        progress_bar=False,
        device="cpu",
    ).fit()
    # 4 layers of 72, 72, 72, 18 parameters; after batch b, floor(4 * (b/8 - 0.5) / 0.5) frozen.
    assert counts == [234, 234, 234, 234, 162, 90, 18, 0]
    # The first layer froze after batch 5: it no longer changes, even with momentum.
    assert torch.equal(weights[4], weights[7]) and not torch.equal(weights[3], weights[4])


def test_resume_freezes_the_same_layers_again():
    at_start = []

    class AtStart(Callback):
        def fit_start(self, state, logger):
            at_start.append(trainable(state.model))

    def make(model):
        return Trainer(
            model=model,
            train_dataloader=loader(blobs(128)),
            max_duration="8ba",
            algorithms=[LayerFreezing(freeze_start=0.5)],
            callbacks=[AtStart()],
            progress_bar=False,
            device="cpu",
        )

    first = make(deep())
    first.fit(duration="6ba")
    saved = copy.deepcopy(first.state.state_dict())
    fresh = deep()
    resumed = make(fresh)
    resumed.state.load_state_dict(saved)
    resumed.fit()
    assert at_start == [234, 90]  # two layers frozen again before the first resumed step
    assert trainable(fresh) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"freeze_start": 1.0}, r"freeze_start must be in \[0, 1\), got 1.0"),
        ({"freeze_level": 0.0}, r"freeze_level must be in \(0, 1\], got 0.0"),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LayerFreezingConfig(**kwargs)


def test_model_without_parameters():
    with pytest.raises(ValueError, match="has no parameters to freeze"):
        freeze_layers(nn.ReLU(), 0.5)


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "layer_freezing") is LayerFreezing
