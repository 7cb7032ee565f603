"""randaugment: the tensor image ops do what their PIL namesakes do; each image gets its own ops."""

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from toy import loader
from trainkit.algorithms import RandAugment, RandAugmentConfig, randaugment_batch, randaugment_image
from trainkit.algorithms._image_ops import ALL_OPS, apply_op
from trainkit.core import Callback, Classifier, Trainer, plugins


def image(seed=0, size=16):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(3, size, size, generator=g) * 0.5 + 0.25  # values in [0.25, 0.75]


@pytest.mark.parametrize("name", sorted(ALL_OPS))
def test_every_op_keeps_shape_and_range(name):
    torch.manual_seed(0)
    out = apply_op(name, image(), 9.0)
    assert out.shape == (3, 16, 16) and out.dtype == torch.float32
    assert out.min() >= 0 and out.max() <= 1


def test_op_semantics():
    img = image()
    stretched = apply_op("autocontrast", img, 0)
    assert torch.allclose(stretched.amin(dim=(1, 2)), torch.zeros(3))
    assert torch.allclose(stretched.amax(dim=(1, 2)), torch.ones(3))
    solarized = apply_op("solarize", img, 5)  # threshold 0.5
    assert torch.equal(solarized, torch.where(img >= 0.5, 1 - img, img))
    posterized = apply_op("posterize", img, 10)  # 4 bits
    assert (((posterized * 255).round().long() % 16) == 0).all()
    big = image(size=64)
    equalized = apply_op("equalize", big, 0)
    counts = torch.histc(equalized[0], bins=4, min=0, max=1)
    assert counts.min() > 0.2 * 4096  # the histogram of [0.25, 0.75] spread flat over [0, 1]
    torch.manual_seed(0)
    shifted = apply_op("translate_x", img, 10)  # 16 / 3 -> 5 pixels, either direction
    assert torch.equal(shifted[..., 5:], img[..., :-5]) or torch.equal(
        shifted[..., :-5], img[..., 5:]
    )
    assert torch.equal(apply_op("rotate", img, 0), img)
    assert torch.equal(apply_op("shear_x", img, 0), img)
    assert torch.allclose(apply_op("brightness", img, 0), img)


def test_each_image_gets_its_own_ops():
    torch.manual_seed(0)
    x = image().expand(8, 3, 16, 16).clone()
    out = randaugment_batch(x, num_ops=2, magnitude=9)
    assert len({tuple(o.flatten()[:64].tolist()) for o in out}) > 4
    torch.manual_seed(1)
    first = randaugment_image(image(), num_ops=1, magnitude=9)
    torch.manual_seed(1)
    assert torch.equal(first, randaugment_image(image(), num_ops=1, magnitude=9))


def test_trainer_augments_training_images_only():
    seen = {"train": [], "eval": []}

    class Probe(Callback):
        def before_forward(self, state, logger):
            seen["train"].append(state.batch[0])

        def eval_before_forward(self, state, logger):
            seen["eval"].append(state.batch[0])

    x = image().expand(32, 3, 16, 16).clone()
    data = TensorDataset(x, torch.zeros(32, dtype=torch.long))
    net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 256, 2))
    Trainer(
        model=Classifier(net, num_classes=2),
        train_dataloader=loader(data),
        eval_dataloader=loader(data),
        max_duration="2ba",
        algorithms=[RandAugment(num_ops=2, magnitude=9)],
        callbacks=[Probe()],
        progress_bar=False,
        device="cpu",
    ).fit()
    assert all(not torch.equal(b, x[:16]) for b in seen["train"])
    assert all(torch.equal(b, x[:16]) for b in seen["eval"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_ops": 0}, "num_ops must be an int of at least 1, got 0"),
        ({"magnitude": 11}, r"magnitude must be in \[0, 10\], got 11"),
        ({"augmentation_set": "fancy"}, "augmentation_set 'fancy' is not one of 'all', 'safe'"),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RandAugmentConfig(**kwargs)


def test_normalised_or_integer_images_are_refused():
    with pytest.raises(
        ValueError, match=r"needs pixel values in \[0, 1\] \(apply it before normalisation\)"
    ):
        randaugment_batch(torch.randn(2, 3, 8, 8))
    with pytest.raises(ValueError, match="needs float images"):
        randaugment_batch(torch.zeros(2, 3, 8, 8, dtype=torch.uint8))


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "randaugment") is RandAugment
