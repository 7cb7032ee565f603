"""channels_last: conv weights and activations become NHWC; results and training unchanged."""

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainkit.algorithms import ChannelsLast, apply_channels_last
from trainkit.core import Callback, Classifier, Trainer, plugins


def cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 2),
    )


def test_changes_memory_format_and_keeps_results():
    model = cnn().eval()
    x = torch.randn(2, 3, 5, 5)
    expected, weight = model(x), model[0].weight
    assert apply_channels_last(model) == 1
    assert model[0].weight is weight  # same Parameter: optimizers stay bound
    assert weight.is_contiguous(memory_format=torch.channels_last)
    assert not weight.is_contiguous()
    assert model[:1](x).is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(model(x), expected)


def test_through_the_trainer():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 3, 5, 5), torch.randint(0, 2, (16,)))
    seen = {}

    class Probe(Callback):
        def after_forward(self, state, logger):
            seen["weight"] = state.model.module[0].weight.is_contiguous(
                memory_format=torch.channels_last
            )

    trainer = Trainer(
        model=Classifier(cnn(), num_classes=2),
        train_dataloader=DataLoader(data, batch_size=8),
        max_duration="2ba",
        algorithms=[ChannelsLast()],
        callbacks=[Probe()],
        progress_bar=False,
        device="cpu",
    )
    trainer.fit()
    assert seen["weight"]
    assert trainer.state.model.module[0].weight.is_contiguous(memory_format=torch.channels_last)


def test_warns_when_nothing_matches():
    with pytest.warns(UserWarning, match="channels_last found no 4-D parameter"):
        assert apply_channels_last(nn.Linear(2, 2)) == 0


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "channels_last") is ChannelsLast
