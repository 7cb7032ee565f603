"""progressive_resizing: image sizes follow the schedule, crops are crops, eval is full size."""

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from toy import loader
from trainkit.algorithms import (
    ProgressiveResizing,
    ProgressiveResizingConfig,
    resize_batch,
    resized_size,
    resizing_scale,
)
from trainkit.core import Callback, plugins
from trainkit.trainer import Classifier, Trainer


def test_schedule():
    cfg = ProgressiveResizingConfig(initial_scale=0.5, delay_fraction=0.25, finetune_fraction=0.25)
    assert [resizing_scale(e, cfg) for e in (0.0, 0.2, 0.25, 0.5, 0.75, 1.0)] == [
        0.5,
        0.5,
        0.5,
        0.75,
        1.0,
        1.0,
    ]


def test_resize_and_crop():
    x = torch.rand(2, 3, 32, 32)
    small, _ = resize_batch(x, scale=0.6, size_increment=8)
    assert small.shape == (2, 3, 16, 16)  # 19.2 rounded down to a multiple of 8
    torch.manual_seed(0)
    crop, _ = resize_batch(x, scale=0.5, mode="crop")
    found = [
        (top, left)
        for top in range(17)
        for left in range(17)
        if torch.equal(x[..., top : top + 16, left : left + 16], crop)
    ]
    assert len(found) == 1
    masks = torch.randint(0, 5, (2, 32, 32))
    small, resized_masks = resize_batch(x, masks, scale=0.5, resize_targets=True)
    assert resized_masks.shape == (2, 16, 16) and resized_masks.dtype == masks.dtype
    assert torch.equal(resized_masks, masks[:, ::2, ::2])  # nearest
    assert torch.equal(small, x[..., ::2, ::2])  # images too, as Composer's "resize" mode


def test_sizes_follow_composers_rounding():
    # The width is rounded to the nearest multiple of the increment; the height follows.
    x = torch.rand(1, 3, 48, 64)
    for scale in [0.3, 0.42, 0.5, 0.55, 0.61, 0.77, 0.9, 0.99]:
        width = round(64 * scale / 4) * 4
        expected = (int(48 * width / 64), width)
        assert resized_size(48, 64, scale, 4) == expected
        assert resize_batch(x, scale=scale)[0].shape[-2:] == expected
    assert resized_size(48, 64, 0.01, 4) == (3, 4)  # never below one increment
    assert resized_size(48, 64, 1.0, 4) == (48, 64)


def test_crop_takes_the_same_region_of_image_and_mask():
    grid = 100 * torch.arange(32).view(32, 1) + torch.arange(32)
    x = grid.float().expand(2, 3, 32, 32).clone()
    masks = grid.expand(2, 32, 32).clone()
    torch.manual_seed(3)
    crop, crop_masks = resize_batch(x, masks, scale=0.5, mode="crop", resize_targets=True)
    assert crop.shape[-2:] == crop_masks.shape[-2:] == (16, 16)
    assert torch.equal(crop[:, 0].long(), crop_masks)
    with pytest.raises(ValueError, match=r"resize_targets needs targets shaped \(N, H, W\)"):
        resize_batch(x, torch.zeros(2, dtype=torch.long), scale=0.5, resize_targets=True)


def test_a_run_sees_a_bounded_set_of_sizes():
    sizes = []

    class Probe(Callback):
        def before_forward(self, state, logger):
            sizes.append(tuple(state.batch[0].shape[-2:]))

    data = TensorDataset(torch.rand(100, 3, 64, 64), torch.randint(0, 2, (100,)))
    net = nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(12, 2))
    algorithm = ProgressiveResizing()  # Composer's defaults: 0.5, delay 0.5, finetune 0.2, 4
    Trainer(
        model=Classifier(net, num_classes=2),
        train_dataloader=loader(data, batch_size=2),
        max_duration="50ba",
        progress_bar=False,
        device="cpu",
        algorithms=[algorithm],
        callbacks=[Probe()],
    ).fit()
    # Every batch gets a new scale while the size grows, but only a few sizes occur.
    scales = [resizing_scale(b / 50, algorithm.config) for b in range(50)]
    expected = {resized_size(64, 64, scale, 4) for scale in scales}
    assert set(sizes) == expected
    assert len(set(scales)) > 15 > len(expected) and expected <= {(w, w) for w in range(32, 65, 4)}


def test_trainer_grows_training_images_and_evaluates_at_full_size():
    sizes = {"train": [], "eval": []}

    class Probe(Callback):
        def before_forward(self, state, logger):
            sizes["train"].append(state.batch[0].shape[-1])

        def eval_before_forward(self, state, logger):
            sizes["eval"].append(state.batch[0].shape[-1])

    data = TensorDataset(torch.rand(64, 3, 32, 32), torch.randint(0, 2, (64,)))
    net = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, 2))
    Trainer(
        model=Classifier(net, num_classes=2),
        train_dataloader=loader(data),
        eval_dataloader=loader(data),
        max_duration="8ba",
        progress_bar=False,
        device="cpu",
        algorithms=[
            ProgressiveResizing(initial_scale=0.5, delay_fraction=0.25, finetune_fraction=0.25)
        ],
        callbacks=[Probe()],
    ).fit()
    # elapsed b/8: 0.5 until 0.25, then 0.5 + (b/8 - 0.25) up to 1 at 0.75.
    assert sizes["train"] == [16, 16, 16, 20, 24, 28, 32, 32]
    assert set(sizes["eval"]) == {32}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"initial_scale": 0.0}, r"initial_scale must be in \(0, 1\]"),
        ({"delay_fraction": 0.7, "finetune_fraction": 0.5}, "must be at most 1"),
        ({"mode": "zoom"}, "mode 'zoom' is not one of 'resize', 'crop'"),
        ({"size_increment": 0}, "size_increment must be positive"),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ProgressiveResizingConfig(**kwargs)


def test_needs_images():
    with pytest.raises(ValueError, match=r"needs images shaped \(N, C, H, W\)"):
        resize_batch(torch.zeros(4, 8), scale=0.5)


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "progressive_resizing") is ProgressiveResizing
