"""cutmix: a box of another sample is pasted and targets mix by the pasted area."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from toy import loader
from trainkit.algorithms import CutMix, CutMixConfig, cutmix_batch, random_box
from trainkit.core import Callback, Classifier, Trainer, plugins


def test_cutmix_batch_pastes_the_box_and_reports_its_area():
    x = torch.arange(2 * 1 * 4 * 4, dtype=torch.float32).reshape(2, 1, 4, 4)
    y = torch.tensor([0, 1])
    indices = torch.tensor([1, 0])
    cut, y_perm, mixing = cutmix_batch(x, y, box=(1, 0, 2, 3), indices=indices)
    expected = x.clone()
    expected[0, :, 1:3, 0:3] = x[1, :, 1:3, 0:3]
    expected[1, :, 1:3, 0:3] = x[0, :, 1:3, 0:3]
    assert torch.equal(cut, expected)
    assert y_perm.tolist() == [1, 0] and mixing == 6 / 16
    assert torch.equal(x, torch.arange(32.0).reshape(2, 1, 4, 4))  # input untouched


def test_random_box_fits_and_has_about_the_area():
    torch.manual_seed(0)
    for area in (0.0, 0.25, 0.5, 1.0):
        top, left, h, w = random_box(32, 32, area)
        assert top >= 0 and top + h <= 32 and left >= 0 and left + w <= 32
        assert h * w <= round(32 * area**0.5) ** 2


def images(n=32):
    g = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.rand(n, 3, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)
    )


class Check(Callback):
    def __init__(self, cutmix):
        self.cutmix, self.raw, self.mixings = cutmix, None, []

    def batch_start(self, state, logger):
        self.raw = state.batch

    def after_loss(self, state, logger):
        c = self.cutmix
        x, y = self.raw
        expected, _, mixing = cutmix_batch(x, y, box=c.box, indices=c.indices)
        assert torch.equal(state.batch[0], expected) and mixing == c.mixing
        soft = torch.lerp(F.one_hot(y, 3).float(), F.one_hot(y[c.indices], 3).float(), mixing)
        torch.testing.assert_close(state.loss, F.cross_entropy(state.outputs, soft))
        self.mixings.append(mixing)


def test_trainer_trains_on_pasted_images_with_area_weighted_loss():
    cutmix = CutMix(alpha=1.0)
    check = Check(cutmix)
    torch.manual_seed(0)
    model = Classifier(nn.Sequential(nn.Flatten(), nn.Linear(3 * 64, 3)), num_classes=3)
    Trainer(
        model=model,
        train_dataloader=loader(images()),
        max_duration="4ba",
        algorithms=[cutmix],
        callbacks=[check],
        progress_bar=False,
        device="cpu",
        seed=0,
    ).fit()
    assert len(check.mixings) == 4 and any(0 < m < 1 for m in check.mixings)


def test_bad_config():
    with pytest.raises(ValueError, match="alpha must be positive, got 0"):
        CutMixConfig(alpha=0)
    with pytest.raises(
        ValueError, match=r"cutmix needs images shaped \(N, C, H, W\), got shape \(4, 3\)"
    ):
        cutmix_batch(torch.zeros(4, 3), torch.zeros(4))
    with pytest.raises(ValueError, match=r"box \(3, 0, 2, 2\) does not fit in a 4x4 image"):
        cutmix_batch(torch.zeros(2, 1, 4, 4), torch.zeros(2), box=(3, 0, 2, 2))


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "cutmix") is CutMix
