"""squeeze_excite: blocks after the wide convs, gates per channel, optimizer covers them."""

import copy

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision.models import resnet50

from trainkit.algorithms import (
    SqueezeExcite,
    SqueezeExcite2d,
    SqueezeExciteConfig,
    SqueezeExciteConv2d,
    apply_squeeze_excite,
)
from trainkit.core import plugins
from trainkit.trainer import Classifier, Trainer


def cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(4, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 2),
    )


def test_adds_blocks_after_the_convs_wide_on_both_sides_only():
    model = cnn()
    x = torch.randn(2, 3, 6, 6)
    shape = model(x).shape
    replaced = apply_squeeze_excite(model, latent_channels=0.25, min_channels=16)
    assert sorted(replaced) == ["4"]  # 4 -> 16 is narrow on its input side (Composer's rule)
    assert isinstance(model[4], SqueezeExciteConv2d)
    assert model[4].se.squeeze.out_features == 4
    assert type(model[0]) is nn.Conv2d and type(model[2]) is nn.Conv2d
    assert model(x).shape == shape


def test_torchvision_resnet50_selection_by_input_and_output_channels():
    model = resnet50()
    expected = {
        name: conv.out_channels
        for name, conv in model.named_modules()
        if isinstance(conv, nn.Conv2d) and min(conv.in_channels, conv.out_channels) >= 128
    }
    params = sum(p.numel() for p in model.parameters())
    replaced = apply_squeeze_excite(model, latent_channels=64, min_channels=128)
    assert set(replaced) == set(expected)
    assert "layer1.0.conv3" not in replaced  # 64 -> 256: narrow input side
    # No biases: each block adds exactly C x 64 + 64 x C weights.
    added = sum(p.numel() for p in model.parameters()) - params
    assert added == sum(2 * 64 * c for c in expected.values())
    x = torch.randn(2, 3, 64, 64)
    model(x).sum().backward()
    with pytest.warns(UserWarning, match="matched no module"):
        assert apply_squeeze_excite(model, min_channels=128) == {}  # applied once only


def test_gate_scales_each_channel_by_a_sigmoid_of_the_means():
    se = SqueezeExcite2d(4, 2)
    assert se.squeeze.bias is None and se.excite.bias is None
    x = torch.randn(3, 4, 5, 5)
    w1, w2 = se.squeeze.weight, se.excite.weight
    gate = torch.sigmoid(torch.relu(x.mean(dim=(2, 3)) @ w1.T) @ w2.T)  # the paper's formula
    torch.testing.assert_close(se(x), x * gate[:, :, None, None])
    assert ((se(x) / x).std(dim=(2, 3)) < 1e-4).all()  # one factor per (sample, channel)


def test_through_the_trainer_the_optimizer_trains_the_new_parameters():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 3, 6, 6), torch.randint(0, 2, (16,)))
    model = Classifier(cnn(), num_classes=2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    trainer = Trainer(
        model=model,
        train_dataloader=DataLoader(data, batch_size=8),
        optimizers=optimizer,
        max_duration="2ba",
        algorithms=[SqueezeExcite(latent_channels=4, min_channels=16)],
        progress_bar=False,
        device="cpu",
        seed=0,  # the new blocks are initialised at INIT; some seeds leave every gate unit dead
    )
    se = trainer.state.model.module[4].se
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for p in trainer.state.model.parameters()}
    assert id(se.squeeze.weight) in held
    before = se.squeeze.weight.detach().clone()
    trainer.fit()
    assert not torch.equal(se.squeeze.weight, before)


def test_refuses_after_training_started():
    model = cnn()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 3, 6, 6)).sum().backward()
    optimizer.step()
    with pytest.raises(ValueError, match="already holds state"):
        apply_squeeze_excite(model, min_channels=16, optimizers=optimizer)


def test_warns_when_nothing_matches():
    with pytest.warns(UserWarning, match="squeeze_excite matched no module"):
        apply_squeeze_excite(cnn(), min_channels=1024)


@pytest.mark.parametrize(
    "kwargs", [{"latent_channels": 0}, {"latent_channels": 2.5}, {"min_channels": 0}]
)
def test_bad_config(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SqueezeExciteConfig(**kwargs)


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "squeeze_excite") is SqueezeExcite


def test_resume_reapplies_the_surgery_and_continues_exactly():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 3, 6, 6), torch.randint(0, 2, (32,)))

    def make():
        model = Classifier(cnn(), num_classes=2)
        return Trainer(
            model=model,
            train_dataloader=DataLoader(data, batch_size=8, shuffle=True),
            optimizers=torch.optim.Adam(model.parameters(), lr=0.01),
            max_duration="4ba",
            algorithms=[SqueezeExcite(latent_channels=4, min_channels=16)],
            progress_bar=False,
            device="cpu",
            seed=3,
        )

    full = make()
    full.fit()
    first = make()
    first.fit(duration="2ba")
    saved = copy.deepcopy(first.state.state_dict())
    assert any(".se." in key for key in saved["model"])
    resumed = make()
    resumed.state.load_state_dict(saved)
    resumed.fit()
    for (name, a), b in zip(
        full.state.model.named_parameters(), resumed.state.model.parameters(), strict=True
    ):
        assert torch.equal(a, b), name
