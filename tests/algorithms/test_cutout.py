"""cutout: each training image loses exactly the configured squares, the same in every channel."""

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from toy import loader
from trainkit.algorithms import CutOut, CutOutConfig, cutout_batch
from trainkit.core import Callback, Classifier, Trainer, plugins


def zero_box(image):
    """The bounding box of the zeros of a 2-D map, and whether it is entirely zero."""
    rows, cols = torch.nonzero(image == 0, as_tuple=True)
    box = image[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
    return (rows.max() - rows.min() + 1, cols.max() - cols.min() + 1), bool((box == 0).all())


def test_one_hole_is_a_square_clipped_at_the_border():
    torch.manual_seed(0)
    out = cutout_batch(torch.ones(64, 3, 16, 16), num_holes=1, length=0.25)
    assert torch.equal(out[:, 0], out[:, 1]) and torch.equal(out[:, 0], out[:, 2])
    full = 0
    for image in out[:, 0]:
        (h, w), solid = zero_box(image)
        assert solid and h <= 4 and w <= 4
        full += int(h == 4 and w == 4)
        assert ((image == 0) | (image == 1)).all()
    assert full > 20  # most squares lie inside the image


def test_pixel_length_and_several_holes():
    torch.manual_seed(0)
    out = cutout_batch(torch.ones(8, 1, 32, 32), num_holes=3, length=5)
    zeros = (out == 0).sum(dim=(1, 2, 3))
    assert (zeros > 0).all() and (zeros <= 3 * 25).all()


def test_trainer_cuts_training_images_only():
    seen = {}

    class Probe(Callback):
        def before_forward(self, state, logger):
            seen.setdefault("train", []).append(state.batch[0])

        def eval_before_forward(self, state, logger):
            seen.setdefault("eval", []).append(state.batch[0])

    data = TensorDataset(torch.ones(32, 1, 8, 8), torch.zeros(32, dtype=torch.long))
    model = Classifier(nn.Sequential(nn.Flatten(), nn.Linear(64, 2)), num_classes=2)
    Trainer(
        model=model,
        train_dataloader=loader(data),
        eval_dataloader=loader(data),
        max_duration="2ba",
        algorithms=[CutOut(length=4)],
        callbacks=[Probe()],
        progress_bar=False,
        device="cpu",
    ).fit()
    for x in seen["train"]:
        assert ((x == 0).sum(dim=(1, 2, 3)) > 0).all()
    assert all((x == 1).all() for x in seen["eval"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_holes": 0}, "num_holes must be an int of at least 1, got 0"),
        ({"length": 0}, "length must be a fraction in"),
        ({"length": 2.5}, "length must be a fraction in"),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CutOutConfig(**kwargs)


def test_needs_images():
    with pytest.raises(ValueError, match=r"cutout needs images shaped \(N, C, H, W\)"):
        cutout_batch(torch.ones(4, 8))


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "cutout") is CutOut
