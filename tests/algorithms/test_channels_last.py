"""channels_last: conv weights and activations become NHWC; results and training unchanged."""

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision.models import resnet18

from trainkit.algorithms import (
    ChannelsLast,
    apply_blurpool,
    apply_channels_last,
    apply_squeeze_excite,
    apply_stochastic_depth,
)
from trainkit.core import Callback, plugins
from trainkit.trainer import Classifier, Trainer


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


def test_torchvision_resnet_with_surgery_stays_channels_last_throughout():
    # After BlurPool, SqueezeExcite and StochasticDepth, every 4-D activation is still NHWC:
    # no layer converts back to NCHW (each conversion would cost a copy on the GPU).
    model = resnet18(num_classes=5).eval()
    apply_blurpool(model)
    apply_squeeze_excite(model, min_channels=128)
    apply_stochastic_depth(model, target="BasicBlock")
    x = torch.randn(2, 3, 64, 64)
    expected = model(x)
    tensors = [t for t in [*model.parameters(), *model.buffers()] if t.ndim == 4]
    assert apply_channels_last(model) == len(tensors)
    assert all(t.is_contiguous(memory_format=torch.channels_last) for t in tensors)
    nchw = []
    for name, module in model.named_modules():
        module.register_forward_hook(
            lambda m, args, out, name=name: (
                nchw.append(name)
                if out.ndim == 4 and not out.is_contiguous(memory_format=torch.channels_last)
                else None
            )
        )
    torch.testing.assert_close(model(x), expected, atol=1e-4, rtol=1e-4)
    assert nchw == []


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
