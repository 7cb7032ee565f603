"""factorize: fewer parameters, same shapes, and the best low-rank approximation to start."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision.models import resnet18

from trainkit.algorithms import (
    Factorize,
    FactorizeConfig,
    FactorizedConv2d,
    FactorizedLinear,
    apply_factorize,
    low_rank_factors,
)
from trainkit.core import plugins
from trainkit.trainer import Classifier, Trainer


def cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),  # 3 input channels: too narrow
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 64),
        nn.ReLU(),
        nn.Linear(64, 2),  # 2 outputs: too narrow
    )


def count(model):
    return sum(p.numel() for p in model.parameters())


def test_reduces_parameters_and_keeps_shapes():
    model = cnn()
    x = torch.randn(2, 3, 8, 8)
    shapes = [model[: i + 1](x).shape for i in range(len(model))]
    before = count(model)
    replaced = apply_factorize(
        model, min_channels=16, latent_channels=8, min_features=16, latent_features=8
    )
    assert sorted(replaced) == ["2", "6"]
    assert isinstance(model[2], FactorizedConv2d) and isinstance(model[6], FactorizedLinear)
    assert model[2].first.out_channels == 8 and model[6].first.out_features == 8
    assert count(model) < before
    assert [model[: i + 1](x).shape for i in range(len(model))] == shapes


def test_starts_from_the_best_low_rank_approximation():
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 24, 3, stride=2, padding=1)
    x = torch.randn(2, 16, 7, 7)
    u, s, vh = torch.linalg.svd(conv.weight.detach().flatten(1), full_matrices=False)
    best = (u[:, :6] * s[:6]) @ vh[:6]
    expected = F.conv2d(x, best.reshape(conv.weight.shape), conv.bias, stride=2, padding=1)
    torch.testing.assert_close(FactorizedConv2d(conv, 6)(x), expected, atol=1e-5, rtol=1e-4)
    # At full rank the factorized layer computes exactly what the layer did.
    linear = nn.Linear(12, 10)
    x = torch.randn(3, 12)
    torch.testing.assert_close(FactorizedLinear(linear, 10)(x), linear(x), atol=1e-5, rtol=1e-4)
    a, b = low_rank_factors(linear.weight, 10)
    assert a.shape == (10, 12) and b.shape == (10, 10)


def test_skips_layers_where_it_would_not_save_parameters():
    model = nn.Sequential(nn.Linear(16, 16))
    with pytest.warns(UserWarning, match="factorize matched no module"):
        assert apply_factorize(model, min_features=16, latent_features=8) == {}


def test_convs_and_linears_have_their_own_thresholds():
    model = cnn()
    assert sorted(apply_factorize(model, min_channels=16, latent_channels=8)) == ["2"]
    model = cnn()
    assert sorted(apply_factorize(model, min_features=16, factorize_convs=False)) == ["6"]


def test_torchvision_resnet18_with_composer_defaults():
    model = resnet18()
    expected = set()
    for name, m in model.named_modules():
        if isinstance(m, nn.Conv2d):
            fan_in, out = m.in_channels * m.weight[0, 0].numel(), m.out_channels
            small = min(m.in_channels, out)
        elif isinstance(m, nn.Linear):
            fan_in, out, small = m.in_features, m.out_features, min(m.in_features, m.out_features)
        else:
            continue
        rank = int(0.25 * small)
        if small >= 512 and rank * (fan_in + out) < fan_in * out:
            expected.add(name)
    before = count(model)
    x = torch.randn(2, 3, 64, 64)
    replaced = apply_factorize(model)
    assert set(replaced) == expected and "fc" in expected and len(expected) == 4
    assert count(model) < before
    out = model(x)
    assert out.shape == (2, 1000)
    out.sum().backward()
    assert model.fc.first.weight.grad is not None


def test_through_the_trainer_the_optimizer_holds_the_factors():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 3, 8, 8), torch.randint(0, 2, (16,)))
    model = Classifier(cnn(), num_classes=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(
        model=model,
        train_dataloader=DataLoader(data, batch_size=8),
        optimizers=optimizer,
        max_duration="2ba",
        algorithms=[Factorize(min_channels=16, latent_channels=0.25)],
        progress_bar=False,
        device="cpu",
    )
    factor = trainer.state.model.module[2].first.weight
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for p in trainer.state.model.parameters()}
    before = factor.detach().clone()
    trainer.fit()
    assert not torch.equal(factor, before)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_channels": 0},
        {"latent_channels": 0},
        {"latent_channels": 1.5},
        {"min_features": 0},
        {"latent_features": 2.5},
    ],
)
def test_bad_config(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        FactorizeConfig(**kwargs)


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "factorize") is Factorize
