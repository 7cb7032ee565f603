"""cutout: one mask per batch (as Composer), squares placed as the paper's code, train data only."""

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from toy import loader
from trainkit.algorithms import CutOut, CutOutConfig, cutout_batch
from trainkit.core import Callback, plugins
from trainkit.trainer import Classifier, Trainer


def zero_box(image):
    """The bounding box of the zeros of a 2-D map, and whether it is entirely zero."""
    rows, cols = torch.nonzero(image == 0, as_tuple=True)
    box = image[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
    return (rows.max() - rows.min() + 1, cols.max() - cols.min() + 1), bool((box == 0).all())


def test_one_mask_serves_the_whole_batch():
    torch.manual_seed(0)
    out = cutout_batch(torch.ones(16, 3, 16, 16), num_holes=2, length=0.25)
    assert (out == out[:1]).all() and (out == 0).any()
    per_image = cutout_batch(torch.ones(16, 3, 16, 16), length=0.25, per_image=True)
    assert torch.equal(per_image[:, 0], per_image[:, 1])  # the same in every channel
    assert len({tuple(m.flatten().tolist()) for m in per_image[:, 0]}) > 1


def coverage_reference(size, side, uniform_sampling):
    """P(row r is cut), by enumerating the centres the paper's code can draw."""
    low, high = (-side // 2, size + side // 2) if uniform_sampling else (0, size)
    centres = range(low, high)
    half = side // 2
    return torch.tensor(
        [sum(c - half <= r < c + half for c in centres) / len(centres) for r in range(size)]
    )


@pytest.mark.parametrize("uniform_sampling", [False, True])
def test_square_side_and_placement_follow_the_papers_code(uniform_sampling):
    torch.manual_seed(0)
    size, draws = 16, 3000
    side = int(0.3 * size)  # Composer: int(length * min(H, W)) = 4
    out = cutout_batch(
        torch.ones(draws, 1, size, size),
        length=0.3,
        uniform_sampling=uniform_sampling,
        per_image=True,
    )[:, 0]
    rows = (out == 0).any(dim=2).float().mean(0)
    torch.testing.assert_close(
        rows, coverage_reference(size, side, uniform_sampling), atol=0.03, rtol=0
    )
    for image in out[:200]:
        if (image == 0).any():
            (h, w), solid = zero_box(image)
            assert solid and h <= side and w <= side


def test_pixel_length_spans_twice_half_the_side():
    torch.manual_seed(0)
    out = cutout_batch(torch.ones(200, 1, 32, 32), length=5, per_image=True)
    sizes = [zero_box(image)[0] for image in out[:, 0] if (image == 0).any()]
    assert max(max(int(h), int(w)) for h, w in sizes) == 4  # [c - 2, c + 2), as the paper's code
    assert sum(int(h) == 4 and int(w) == 4 for h, w in sizes) > 100  # most lie inside


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
        assert ((x == 0).sum(dim=(1, 2, 3)) > 0).all() and (x == x[:1]).all()
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
