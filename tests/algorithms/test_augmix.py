"""augmix: the output is the original blended with a weighted mix of augmented chains."""

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from toy import loader
from trainkit.algorithms import AugMix, AugMixConfig, augmix_batch, augmix_image
from trainkit.core import Callback, Classifier, Trainer, plugins


def image(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(3, 16, 16, generator=g)


def test_output_lies_between_the_image_and_its_augmented_mix():
    # With one deterministic op, every chain is solarize(img): out = img + m * (solarize(img) - img).
    img = image()
    torch.manual_seed(0)
    out = augmix_image(img, severity=5, depth=1, augmentation_set=["solarize"])
    solarized = torch.where(img >= 0.5, 1 - img, img)
    far = (solarized - img).abs() > 0.1
    m = ((out - img)[far] / (solarized - img)[far]).mean()
    assert 0 < m < 1
    torch.testing.assert_close(out, img + m * (solarized - img))


def test_chains_are_weighted_by_a_dirichlet_sample():
    # Two chains of different lengths of a 0-level shift: translate by 0 is identity, so out == img.
    img = image()
    out = augmix_image(
        img, severity=0, depth=2, width=4, augmentation_set=["translate_x", "rotate"]
    )
    torch.testing.assert_close(out, img)


def test_batch_keeps_range_and_differs_per_image():
    torch.manual_seed(0)
    x = image().expand(6, 3, 16, 16).clone()
    out = augmix_batch(x, severity=9, augmentation_set="all")
    assert out.shape == x.shape and out.min() >= 0 and out.max() <= 1
    assert len({tuple(o.flatten()[:32].tolist()) for o in out}) == 6


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
        algorithms=[AugMix(severity=9)],
        callbacks=[Probe()],
        progress_bar=False,
        device="cpu",
    ).fit()
    assert all(not torch.equal(b, x[:16]) for b in seen["train"])
    assert all(torch.equal(b, x[:16]) for b in seen["eval"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"severity": -1}, r"severity must be in \[0, 10\], got -1"),
        ({"depth": 0}, "depth must be -1 .random 1 to 3. or at least 1, got 0"),
        ({"width": 0}, "width must be at least 1, got 0"),
        ({"alpha": 0}, "alpha must be positive, got 0"),
        ({"augmentation_set": "most"}, "augmentation_set 'most' is not one of 'all', 'safe'"),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AugMixConfig(**kwargs)


def test_bad_images_and_ops():
    with pytest.raises(ValueError, match=r"augmix needs pixel values in \[0, 1\]"):
        augmix_batch(torch.full((1, 3, 4, 4), 2.0))
    with pytest.raises(ValueError, match=r"unknown operations \['blur'\]"):
        augmix_image(image(), augmentation_set=["blur"])


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "augmix") is AugMix
