"""weight_standardization: convs compute with standardized filters; the stored weight trains."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision.models import resnet18

from trainkit.algorithms import (
    WeightStandardization,
    WeightStandardizationConfig,
    apply_weight_standardization,
)
from trainkit.core import plugins
from trainkit.trainer import Classifier, Trainer


def cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.GroupNorm(2, 8),
        nn.ReLU(),
        nn.Conv2d(8, 2, 1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
    )


def test_forward_uses_zero_mean_unit_variance_filters():
    model = cnn()
    stored = model[0].weight
    x = torch.randn(2, 3, 5, 5)
    assert apply_weight_standardization(model) == ["0", "3"]
    assert model[0].parametrizations.weight.original is stored  # optimizers stay bound
    weight = model[0].weight
    var, mean = torch.var_mean(weight, dim=(1, 2, 3), unbiased=False)
    torch.testing.assert_close(mean, torch.zeros(8), atol=1e-6, rtol=0)
    torch.testing.assert_close(var, torch.ones(8), atol=1e-5, rtol=0)
    expected = F.conv2d(x, weight, model[0].bias, padding=1)
    torch.testing.assert_close(model[0](x), expected)
    assert model(x).shape == (2, 2)


def test_ignores_the_last_layers():
    model = cnn()
    assert apply_weight_standardization(model, n_last_layers_ignore=1) == ["0"]
    assert type(model[3]).__name__ == "Conv2d" and not hasattr(model[3], "parametrizations")


def test_torchvision_resnet18_the_last_convs_are_the_last_to_run():
    # "Last" is module order; on torchvision's ResNets that is the order they run in, which
    # a torch.fx trace of the forward pass (Composer's order) gives.
    model = resnet18()
    traced = torch.fx.symbolic_trace(model)
    run_order = [n.target for n in traced.graph.nodes if n.op == "call_module"]
    convs_run = [t for t in run_order if isinstance(model.get_submodule(t), nn.Conv2d)]
    names = apply_weight_standardization(model, n_last_layers_ignore=3)
    assert names == convs_run[:-3] and len(convs_run) == 20
    assert not any(hasattr(model.get_submodule(n), "parametrizations") for n in convs_run[-3:])
    x = torch.randn(2, 3, 32, 32)
    model(x).sum().backward()
    stored = model.conv1.parametrizations.weight.original
    assert stored.grad is not None
    w = model.conv1.weight
    torch.testing.assert_close(w.mean(dim=(1, 2, 3)), torch.zeros(64), atol=1e-5, rtol=0)


def test_through_the_trainer_the_stored_weight_trains():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 3, 5, 5), torch.randint(0, 2, (16,)))
    model = Classifier(cnn(), num_classes=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    stored = model.module[0].weight
    trainer = Trainer(
        model=model,
        train_dataloader=DataLoader(data, batch_size=8),
        optimizers=optimizer,
        max_duration="2ba",
        algorithms=[WeightStandardization()],
        progress_bar=False,
        device="cpu",
    )
    before = stored.detach().clone()
    trainer.fit()
    assert trainer.state.model.module[0].parametrizations.weight.original is stored
    assert not torch.equal(stored, before)
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for p in trainer.state.model.parameters()}


def test_refuses_after_training_started():
    model = cnn()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 3, 5, 5)).sum().backward()
    optimizer.step()
    with pytest.raises(ValueError, match="already holds state"):
        apply_weight_standardization(model, optimizers=optimizer)


def test_warns_when_nothing_matches():
    with pytest.warns(UserWarning, match="weight_standardization matched no convolution"):
        apply_weight_standardization(cnn(), n_last_layers_ignore=2)


def test_bad_config():
    with pytest.raises(ValueError, match="n_last_layers_ignore"):
        WeightStandardizationConfig(n_last_layers_ignore=-1)


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "weight_standardization") is WeightStandardization
