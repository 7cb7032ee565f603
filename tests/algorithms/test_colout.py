"""colout: exactly the configured share of rows and columns goes; the rest keep their order."""

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from toy import loader
from trainkit.algorithms import ColOut, ColOutConfig, colout_batch
from trainkit.core import Callback, Classifier, Trainer, plugins


def coded(n=2, h=20, w=10):
    """Pixel value 100 * row + column, so the kept rows and columns can be read back."""
    grid = 100 * torch.arange(h).view(h, 1) + torch.arange(w).view(1, w)
    return grid.float().expand(n, 3, h, w).clone()


def test_drops_the_share_and_keeps_the_rest_in_order():
    torch.manual_seed(0)
    out, _ = colout_batch(coded(), p_row=0.25, p_col=0.3)
    assert out.shape == (2, 3, 15, 7)
    rows, cols = (out[0, 0, :, 0] // 100).long(), (out[0, 0, 0, :] % 100).long()
    assert rows.tolist() == sorted(set(rows.tolist())) and cols.tolist() == sorted(
        set(cols.tolist())
    )
    expected = 100 * rows.view(-1, 1) + cols.view(1, -1)
    assert torch.equal(out, expected.float().expand(2, 3, 15, 7))


def test_masks_lose_the_same_rows_and_columns():
    torch.manual_seed(0)
    x = coded()
    masks = (100 * torch.arange(20).view(20, 1) + torch.arange(10)).expand(2, 20, 10)
    out, out_masks = colout_batch(x, masks, p_row=0.5, p_col=0.5, resize_targets=True)
    assert torch.equal(out[:, 0].long(), out_masks)


def test_trainer_shrinks_training_images():
    shapes = []

    class Probe(Callback):
        def before_forward(self, state, logger):
            shapes.append(tuple(state.batch[0].shape[-2:]))

    data = TensorDataset(torch.rand(32, 3, 20, 20), torch.randint(0, 2, (32,)))
    net = nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(12, 2))
    Trainer(
        model=Classifier(net, num_classes=2),
        train_dataloader=loader(data),
        max_duration="2ba",
        algorithms=[ColOut(p_row=0.2, p_col=0.1)],
        callbacks=[Probe()],
        progress_bar=False,
        device="cpu",
    ).fit()
    assert shapes == [(16, 18), (16, 18)]


def test_bad_config():
    with pytest.raises(ValueError, match=r"p_row must be in \[0, 1\), got 1.0"):
        ColOutConfig(p_row=1.0)
    with pytest.raises(ValueError, match=r"p_col must be in \[0, 1\), got -0.1"):
        ColOutConfig(p_col=-0.1)
    with pytest.raises(ValueError, match=r"colout needs images shaped \(N, C, H, W\)"):
        colout_batch(torch.zeros(4, 8))


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "colout") is ColOut
