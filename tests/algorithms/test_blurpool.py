"""blurpool: replaces exactly the strided convs and max pools, keeps shapes, trains."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision.models import resnet18, resnet50

from trainkit.algorithms import (
    BlurConv2d,
    BlurMaxPool2d,
    BlurPool,
    BlurPoolConfig,
    apply_blurpool,
    blur_2d,
)
from trainkit.core import plugins
from trainkit.trainer import Classifier, Trainer


def cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),  # stem: too few input channels
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),  # stride 1: kept
        nn.MaxPool2d(3, stride=2, padding=1),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 2),
    )


def test_replaces_exactly_the_strided_convs_and_pools_and_keeps_shapes():
    model = cnn()
    x = torch.randn(2, 3, 15, 17)
    shapes = [m(x).shape for m in (model[:1], model[:4], model[:5])]
    conv_weight = model[4].weight
    replaced = apply_blurpool(model)
    assert sorted(replaced) == ["3", "4"]
    assert isinstance(model[3], BlurMaxPool2d) and isinstance(model[4], BlurConv2d)
    assert type(model[0]) is nn.Conv2d and type(model[2]) is nn.Conv2d
    assert model[4].conv.weight is conv_weight
    assert [m(x).shape for m in (model[:1], model[:4], model[:5])] == shapes


def test_blur_is_a_low_pass_filter():
    # A checkerboard (highest frequency) is smoothed towards its mean by the blur.
    board = (torch.arange(8)[:, None] + torch.arange(8)[None, :]) % 2
    x = board.float().expand(1, 16, 8, 8).contiguous()
    pool = BlurMaxPool2d(nn.MaxPool2d(2, 2))
    conv = nn.Conv2d(16, 16, 1, stride=2, bias=False)
    nn.init.dirac_(conv.weight)
    blurred = BlurConv2d(conv)(x)[..., 1:-1, 1:-1]
    assert torch.allclose(blurred, torch.full_like(blurred, 0.5))
    assert pool(x).shape == nn.MaxPool2d(2, 2)(x).shape


def test_blur_is_the_binomial_filter_before_the_conv_or_after_it():
    # Reference computed here: the 3x3 filter [1 2 1]^T [1 2 1] / 16, zero padding 1.
    torch.manual_seed(0)
    x = torch.randn(2, 16, 9, 11)
    row = torch.tensor([1.0, 2.0, 1.0])
    kernel = (row[:, None] * row[None, :] / 16).expand(16, 1, 3, 3)
    reference = F.conv2d(x, kernel, padding=1, groups=16)
    torch.testing.assert_close(blur_2d(x), reference)
    conv = nn.Conv2d(16, 8, 3, stride=2, padding=1)
    torch.testing.assert_close(BlurConv2d(conv)(x), conv(reference))
    dense = F.conv2d(x, conv.weight, conv.bias, padding=1)
    expected = F.conv2d(dense, kernel[:8], stride=2, padding=1, groups=8)
    torch.testing.assert_close(BlurConv2d(conv, blur_first=False)(x), expected)
    assert BlurConv2d(conv, blur_first=False)(x).shape == conv(x).shape
    pool = nn.MaxPool2d(3, 2, 1)
    expected = F.conv2d(F.max_pool2d(x, 3, 1, 1), kernel, stride=2, padding=1, groups=16)
    torch.testing.assert_close(BlurMaxPool2d(pool)(x), expected)


def test_torchvision_resnets_get_the_blurs_composer_puts_in_them():
    for make, blocks in ((resnet18, 3), (resnet50, 3)):
        model = make()
        x = torch.randn(2, 3, 64, 64)
        model.eval()
        shape = model(x).shape
        replaced = apply_blurpool(model)
        # The max pool, and in each downsampling block its strided conv and its 1x1 shortcut;
        # the 3-channel stem conv is below min_channels.
        convs = sorted(n for n, m in replaced.items() if isinstance(m, BlurConv2d))
        assert [n for n, m in replaced.items() if isinstance(m, BlurMaxPool2d)] == ["maxpool"]
        assert len(convs) == 2 * blocks and "conv1" not in convs
        assert all(n.startswith(("layer2.0.", "layer3.0.", "layer4.0.")) for n in convs)
        assert model(x).shape == shape


def test_applying_twice_blurs_once():
    model = resnet18()
    first = apply_blurpool(model)
    with pytest.warns(UserWarning, match="matched no module"):
        assert apply_blurpool(model) == {}
    assert sum(isinstance(m, BlurConv2d | BlurMaxPool2d) for m in model.modules()) == len(first)


def test_the_filter_is_not_in_checkpoints():
    model = resnet18()
    keys = set(model.state_dict())
    apply_blurpool(model)
    renamed = {k.replace(".conv.", ".") for k in model.state_dict()}
    assert not any("blur_filter" in k for k in model.state_dict())
    assert len(renamed) == len(keys)


def test_min_channels_and_options():
    model = cnn()
    assert sorted(apply_blurpool(model, min_channels=0, replace_maxpools=False)) == ["0", "4"]
    model = cnn()
    assert sorted(apply_blurpool(model, replace_convs=False)) == ["3"]


def test_through_the_trainer_at_init():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 3, 12, 12), torch.randint(0, 2, (16,)))
    model = Classifier(cnn(), num_classes=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(
        model=model,
        train_dataloader=DataLoader(data, batch_size=8),
        optimizers=optimizer,
        max_duration="2ba",
        algorithms=[BlurPool()],
        progress_bar=False,
        device="cpu",
    )
    assert isinstance(trainer.state.model.module[4], BlurConv2d)
    before = trainer.state.model.module[4].conv.weight.detach().clone()
    trainer.fit()
    assert not torch.equal(trainer.state.model.module[4].conv.weight, before)
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for p in trainer.state.model.parameters()}


def test_warns_when_nothing_matches():
    with pytest.warns(UserWarning, match="blurpool matched no module"):
        apply_blurpool(nn.Sequential(nn.Linear(2, 2)))


def test_bad_config():
    with pytest.raises(ValueError, match="min_channels"):
        BlurPoolConfig(min_channels=-1)
    with pytest.raises(ValueError, match="replace_convs and replace_maxpools are both False"):
        BlurPoolConfig(replace_convs=False, replace_maxpools=False)


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "blurpool") is BlurPool
