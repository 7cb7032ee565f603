"""ghost_batchnorm: each ghost batch is normalized on its own; eval is the plain BatchNorm."""

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision.models import resnet18

from trainkit.algorithms import (
    GhostBatchNorm,
    GhostBatchNormConfig,
    GhostBatchNormLayer,
    apply_ghost_batchnorm,
)
from trainkit.core import Callback, plugins
from trainkit.trainer import Classifier, Trainer


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))


def test_normalizes_per_ghost_batch():
    torch.manual_seed(0)
    layer = GhostBatchNormLayer(nn.BatchNorm1d(6, momentum=0.3), ghost_batch_size=4)
    offsets = torch.arange(4.0).repeat_interleave(4)[:, None] * 10  # each chunk its own mean
    x = torch.randn(16, 6) + offsets
    out = layer(x)
    for chunk in out.chunk(4):
        var, mean = torch.var_mean(chunk, dim=0, unbiased=False)
        torch.testing.assert_close(mean, torch.zeros(6), atol=1e-5, rtol=0)
        torch.testing.assert_close(var, torch.ones(6), atol=1e-3, rtol=0)
    # Plain BatchNorm would have kept the chunk offsets.
    plain = nn.BatchNorm1d(6)(x)
    assert plain[:4].mean() < -1 and plain[-4:].mean() > 1
    # Running statistics: one update per chunk, with momentum / chunks, restored after.
    expected = torch.zeros(6)
    for chunk in x.chunk(4):
        expected = (1 - 0.3 / 4) * expected + 0.3 / 4 * chunk.mean(dim=0)
    torch.testing.assert_close(layer.batchnorm.running_mean, expected)
    assert layer.batchnorm.momentum == 0.3


def test_eval_is_the_plain_batchnorm():
    model = net()
    x = torch.randn(8, 4)
    model.train()(torch.randn(32, 4))
    model.eval()
    expected = model(x)
    assert list(apply_ghost_batchnorm(model, ghost_batch_size=2)) == ["1"]
    assert isinstance(model[1], GhostBatchNormLayer)
    torch.testing.assert_close(model.eval()(x), expected)


def test_torchvision_resnet18_every_batchnorm_once():
    model = resnet18(num_classes=3)
    names = [n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
    replaced = apply_ghost_batchnorm(model, ghost_batch_size=2)
    assert sorted(replaced) == sorted(names) and len(names) == 20
    with pytest.warns(UserWarning, match="matched no module"):
        assert apply_ghost_batchnorm(model, ghost_batch_size=2) == {}  # not wrapped twice
    # The stem's BatchNorm normalizes each pair of samples on its own.
    x = torch.randn(4, 3, 32, 32)
    x[2:] = x[2:] * 5 + 3
    stem = model.bn1(model.conv1(x))
    for pair in stem.chunk(2):
        var, mean = torch.var_mean(pair, dim=(0, 2, 3), unbiased=False)
        torch.testing.assert_close(mean, torch.zeros(64), atol=1e-4, rtol=0)
        torch.testing.assert_close(var, torch.ones(64), atol=1e-2, rtol=0)
    model(x).sum().backward()
    assert model.conv1.weight.grad is not None


def test_through_the_trainer():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    seen = []

    class Probe(Callback):
        def after_forward(self, state, logger):
            norm = state.model.module[1]
            seen.append((type(norm), norm.batchnorm.num_batches_tracked.item()))

    model = Classifier(net(), num_classes=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(
        model=model,
        train_dataloader=DataLoader(data, batch_size=16),
        optimizers=optimizer,
        max_duration="2ba",
        algorithms=[GhostBatchNorm(ghost_batch_size=4)],
        callbacks=[Probe()],
        progress_bar=False,
        device="cpu",
    )
    trainer.fit()
    assert seen == [(GhostBatchNormLayer, 4), (GhostBatchNormLayer, 8)]  # 4 ghost batches each
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for p in trainer.state.model.parameters()}


def test_warns_when_nothing_matches():
    with pytest.warns(UserWarning, match="ghost_batchnorm matched no module"):
        apply_ghost_batchnorm(nn.Sequential(nn.Linear(2, 2)))


def test_bad_config():
    with pytest.raises(ValueError, match="ghost_batch_size must be >= 2"):
        GhostBatchNormConfig(ghost_batch_size=1)


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "ghost_batchnorm") is GhostBatchNorm
