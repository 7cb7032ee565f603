"""cutmix: a box of another sample is pasted (drawn as the paper's code) and the targets mix by
the pasted area: as dense targets (interpolate_loss=False), losses (True), or pasted masks."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from toy import loader
from trainkit.algorithms import CutMix, CutMixConfig, cutmix_batch, random_box
from trainkit.core import Callback, plugins
from trainkit.trainer import Classifier, Trainer


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


def coverage_reference(size, cut, uniform_sampling):
    """P(row r is in the box), by enumerating the centres the paper's code can draw."""
    low, high = (-cut // 2, size + cut // 2) if uniform_sampling else (0, size)
    centres = range(low, high)
    return torch.tensor(
        [sum(c - cut // 2 <= r < c + cut // 2 for c in centres) / len(centres) for r in range(size)]
    )


@pytest.mark.parametrize("uniform_sampling", [False, True])
def test_box_side_and_placement_follow_the_papers_code(uniform_sampling):
    torch.manual_seed(0)
    size, area, draws = 16, 0.3, 6000
    cut = int(size * area**0.5)  # 8
    rows, cols = torch.zeros(size), torch.zeros(size)
    for _ in range(draws):
        top, left, h, w = random_box(size, size, area, uniform_sampling=uniform_sampling)
        assert top >= 0 and top + h <= size and left >= 0 and left + w <= size
        assert h <= cut // 2 * 2 and w <= cut // 2 * 2
        if top > 0 and top + h < size:
            assert h == cut // 2 * 2  # unclipped: [c - cut // 2, c + cut // 2)
        rows[top : top + h] += 1
        cols[left : left + w] += 1
    expected = coverage_reference(size, cut, uniform_sampling)
    torch.testing.assert_close(rows / draws, expected, atol=0.03, rtol=0)
    torch.testing.assert_close(cols / draws, expected, atol=0.03, rtol=0)
    if uniform_sampling:  # every pixel equally likely to be covered
        assert torch.allclose(expected, expected.mean())


def images(n=32, classes=3, masks=False):
    g = torch.Generator().manual_seed(0)
    shape = (n, 8, 8) if masks else (n,)
    return TensorDataset(
        torch.rand(n, 3, 8, 8, generator=g), torch.randint(0, classes, shape, generator=g)
    )


class Check(Callback):
    def __init__(self, cutmix):
        self.cutmix, self.raw, self.seen = cutmix, None, []

    def batch_start(self, state, logger):
        self.raw = state.batch

    def before_loss(self, state, logger):
        self.targets = state.batch[1]

    def after_loss(self, state, logger):
        c = self.cutmix
        x, y = self.raw
        expected, _, mixing = cutmix_batch(x, y, box=c.box, indices=c.indices)
        assert torch.equal(state.batch[0], expected) and mixing == c.mixing
        assert torch.equal(state.batch[1], y)  # put back after the loss
        loss, outputs = state.loss.detach(), state.outputs.detach()
        self.seen.append((mixing, self.targets, loss, outputs, y, c.indices, c.box))


def train(cutmix, model, data):
    check = Check(cutmix)
    Trainer(
        model=model,
        train_dataloader=loader(data),
        max_duration="4ba",
        algorithms=[cutmix],
        callbacks=[check],
        progress_bar=False,
        device="cpu",
        seed=0,
    ).fit()
    assert len(check.seen) == 4 and any(0 < m < 1 for m, *_ in check.seen)
    return check.seen


def classifier():
    torch.manual_seed(0)
    return Classifier(nn.Sequential(nn.Flatten(), nn.Linear(3 * 64, 3)), num_classes=3)


@pytest.mark.parametrize("interpolate_loss", [False, True])
def test_targets_or_losses_mix_by_the_pasted_area(interpolate_loss):
    cutmix = CutMix(alpha=1.0, interpolate_loss=interpolate_loss)
    for mixing, targets, loss, outputs, y, perm, _ in train(cutmix, classifier(), images()):
        one_hot = F.one_hot(y, 3).float()
        if interpolate_loss:
            assert torch.equal(targets, y)
        else:
            torch.testing.assert_close(targets, (1 - mixing) * one_hot + mixing * one_hot[perm])
        expected = (1 - mixing) * F.cross_entropy(outputs, y) + mixing * F.cross_entropy(
            outputs, y[perm]
        )
        torch.testing.assert_close(loss, expected)


def test_masks_get_the_same_box_pasted():
    torch.manual_seed(0)
    model = Classifier(nn.Conv2d(3, 3, 1), train_metrics={})  # per-pixel scores (N, 3, 8, 8)
    for _, targets, loss, outputs, y, perm, box in train(CutMix(), model, images(masks=True)):
        top, left, h, w = box
        expected = y.clone()
        expected[:, top : top + h, left : left + w] = y[perm][:, top : top + h, left : left + w]
        assert torch.equal(targets, expected)
        torch.testing.assert_close(loss, F.cross_entropy(outputs, expected))
    with pytest.raises(Exception, match="cannot interpolate the loss for targets shaped like"):
        train(CutMix(interpolate_loss=True), model, images(masks=True))


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
