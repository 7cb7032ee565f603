"""layer_freezing: Composer's layers and schedule (never the head), and no optimizer effect
(step, momentum, weight decay) on frozen parameters."""

import copy

import pytest
import torch
from torch import nn

from toy import blobs, loader
from trainkit.algorithms import LayerFreezing, LayerFreezingConfig, freeze_layers, frozen_fraction
from trainkit.algorithms.layer_freezing import frozen_count
from trainkit.core import Callback, plugins
from trainkit.trainer import Classifier, Trainer
from trainkit.trainer.optim import DecoupledAdamW


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


def composer_layers(module, found):
    """Composer's ``_get_layers``, restated: leaves with parameters, depth first."""
    if len(list(module.children())) == 0 and len(list(module.parameters())) > 0:
        found.append(module)
    else:
        for child in module.children():
            composer_layers(child, found)
    return found


def test_schedule():
    assert frozen_fraction(0.25, freeze_start=0.5) == 0.0
    assert frozen_fraction(0.75, freeze_start=0.5) == 0.5
    assert frozen_fraction(1.0, freeze_start=0.5, freeze_level=0.5) == 0.5


def test_freezes_the_earliest_leaf_layers_and_never_the_last():
    class Block(nn.Module):  # owns a parameter and has children: only its leaves are layers
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(8))
            self.inner = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))

        def forward(self, x):
            return self.inner(x) * self.scale

    model = nn.Sequential(nn.Linear(8, 8), Block(), nn.Linear(8, 2))
    layers = composer_layers(model, [])
    assert len(layers) == 4
    for fraction in (0.0, 0.3, 0.5, 0.7, 1.0):
        fresh = copy.deepcopy(model)
        count = freeze_layers(fresh, fraction)
        assert count == int(fraction * (len(layers) - 1)) == frozen_count(4, fraction)
        frozen = {n for n, p in fresh.named_parameters() if not p.requires_grad}
        expected = {
            f"{name}.{p}"
            for name, module in model.named_modules()
            if any(module is layer for layer in layers[:count])
            for p, _ in module.named_parameters()
        }
        assert frozen == expected
        assert all(p.requires_grad for p in fresh[2].parameters())  # the head never freezes
        assert fresh[1].scale.requires_grad  # not a leaf layer


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.1),
        lambda params: torch.optim.AdamW(params, lr=0.01, weight_decay=0.5),
        lambda params: DecoupledAdamW(params, lr=0.01, weight_decay=1e-5),
    ],
)
def test_frozen_parameters_get_no_step_momentum_or_weight_decay(make_optimizer):
    model = deep()
    optimizer = make_optimizer(model.parameters())
    x, y = blobs(32)[:]
    for step in range(4):
        if step == 2:  # after two steps: momentum and Adam moments are built up
            freeze_layers(model, 1.0)
            frozen = [p.detach().clone() for p in model.module[0].parameters()]
        optimizer.zero_grad(set_to_none=False)  # zeroes instead of clearing: still no effect
        model.loss(model((x, y)), (x, y)).backward()
        optimizer.step()
    after = list(model.module[0].parameters())
    assert all(torch.equal(a, b) for a, b in zip(after, frozen, strict=True))
    assert not torch.equal(model.module[6].weight, deep().module[6].weight)  # the head trained


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
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01),
        algorithms=[LayerFreezing(freeze_start=0.5, freeze_level=1.0)],
        callbacks=[Count()],
        progress_bar=False,
        device="cpu",
    ).fit()
    # 4 layers of 72, 72, 72, 18 parameters; after batch b, int(3 * (b/8 - 0.5) / 0.5) frozen.
    expected_frozen = [int(3 * max(b / 8 - 0.5, 0) / 0.5 + 1e-9) for b in range(1, 9)]
    sizes = [72, 72, 72, 18]
    assert counts == [sum(sizes[f:]) for f in expected_frozen] == [234] * 5 + [162, 90, 18]
    # The first layer froze after batch 6: it no longer changes, despite momentum and decay.
    assert torch.equal(weights[5], weights[7]) and not torch.equal(weights[4], weights[5])


def test_resume_freezes_the_same_layers_again_and_is_exact():
    at_start = []

    class AtStart(Callback):
        def fit_start(self, state, logger):
            at_start.append(trainable(state.model))

    class StopAt6(Callback):
        def batch_end(self, state, logger):
            if state.timestamp.batch == 6:
                state.stop_training()  # an interrupted run: max_duration stays 8ba

    def make(model, *callbacks):
        return Trainer(
            model=model,
            train_dataloader=loader(blobs(128)),
            max_duration="8ba",
            optimizers=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
            algorithms=[LayerFreezing(freeze_start=0.25)],
            callbacks=[AtStart(), *callbacks],
            progress_bar=False,
            device="cpu",
            seed=1,
        )

    full = make(deep())
    full.fit()
    first = make(deep(), StopAt6())
    first.fit()
    saved = copy.deepcopy(first.state.state_dict())
    fresh = deep()
    resumed = make(fresh)
    resumed.state.load_state_dict(saved)
    resumed.fit()
    assert at_start == [234, 234, 90]  # two layers frozen again before the first resumed step
    assert trainable(fresh) == 18
    for a, b in zip(fresh.parameters(), full.state.model.parameters(), strict=True):
        assert torch.equal(a, b)


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
