"""augmix: the output is the original blended with a weighted mix of augmented chains, on
tensors and PIL images alike."""

import pytest
import torch
import torchvision.transforms as T
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision.datasets import FakeData

from toy import loader
from trainkit.algorithms import (
    AugmentAndMixTransform,
    AugMix,
    AugMixConfig,
    augmix_batch,
    augmix_image,
)
from trainkit.algorithms.augmix import sample_level
from trainkit.core import Callback, plugins
from trainkit.trainer import Classifier, Trainer


def image(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(3, 16, 16, generator=g)


def test_output_lies_between_the_image_and_its_augmented_mix():
    # With one op that ignores the level, every chain is autocontrast(img):
    # out = img + m * (autocontrast(img) - img).
    img = image() * 0.5 + 0.25
    torch.manual_seed(0)
    out = augmix_image(img, severity=5, depth=1, augmentation_set=["autocontrast"])
    low, high = img.amin(dim=(1, 2), keepdim=True), img.amax(dim=(1, 2), keepdim=True)
    stretched = (img - low) / (high - low)
    far = (stretched - img).abs() > 0.1
    m = ((out - img)[far] / (stretched - img)[far]).mean()
    assert 0 < m < 1
    torch.testing.assert_close(out, img + m * (stretched - img))


def test_each_operation_draws_its_strength_up_to_the_severity():
    # As in the paper's code: uniform on [0.1, severity].
    torch.manual_seed(0)
    levels = torch.tensor([sample_level(6.0) for _ in range(4000)])
    assert levels.min() >= 0.1 and levels.max() <= 6.0
    assert abs(levels.mean().item() - 3.05) < 0.1
    assert abs(levels.std().item() - 5.9 / 12**0.5) < 0.1
    assert sample_level(0.0) == 0.0


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


def pil_image(seed=0, size=(20, 16)):
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(40, 200, (size[1], size[0], 3), generator=g, dtype=torch.uint8)
    return Image.frombytes("RGB", size, pixels.numpy().tobytes())


def pixels_of(img):
    width, height = img.size
    raw = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
    return raw.view(height, width, -1).permute(2, 0, 1).float()


@pytest.mark.parametrize("ops", [["posterize", "solarize"], ["equalize", "translate_x"]])
def test_a_pil_image_is_mixed_as_its_tensor_would_be(ops):
    # The same random draws in both forms; these ops agree pixel for pixel, so the two
    # results differ only by the final rounding to 8 bits.
    img = pil_image()
    torch.manual_seed(5)
    out = augmix_image(img, severity=8, width=3, augmentation_set=ops)
    torch.manual_seed(5)
    expected = augmix_image(pixels_of(img) / 255, severity=8, width=3, augmentation_set=ops)
    assert isinstance(out, Image.Image) and out.size == img.size and out.mode == "RGB"
    assert (pixels_of(out) - expected * 255).abs().max() <= 0.5 + 1e-3
    assert not torch.equal(pixels_of(out), pixels_of(img))


def test_transform_and_the_algorithm_in_the_dataset():
    transform = AugmentAndMixTransform(severity=3, augmentation_set="all")
    img = pil_image()
    outs = {transform(img).tobytes() for _ in range(6)}
    assert len(outs) == 6 and "severity=3" in repr(transform)
    dataset = FakeData(size=16, image_size=(3, 12, 12), num_classes=2, transform=T.ToTensor())
    plain = [dataset[i][0] for i in range(16)]
    net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 144, 2))
    Trainer(
        model=Classifier(net, num_classes=2),
        train_dataloader=DataLoader(dataset, batch_size=8),
        max_duration="2ba",
        algorithms=[AugMix(batch=False)],
        progress_bar=False,
        device="cpu",
    ).fit()
    assert [type(t) for t in dataset.transform.transforms] == [AugmentAndMixTransform, T.ToTensor]
    assert sum(not torch.equal(p, dataset[i][0]) for i, p in enumerate(plain)) >= 12
