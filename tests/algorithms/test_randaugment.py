"""randaugment: the tensor image ops do what their PIL namesakes do; each image gets its own
ops; the PIL transform runs in a dataset, or the algorithm puts it there."""

import sys

import pytest
import torch
import torchvision.transforms as T
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision.datasets import FakeData

from toy import loader
from trainkit.algorithms import (
    RandAugment,
    RandAugmentConfig,
    RandAugmentTransform,
    randaugment_batch,
    randaugment_image,
)
from trainkit.algorithms._image_ops import ALL_OPS, apply_op, pil_ops
from trainkit.core import Callback, plugins
from trainkit.trainer import Classifier, Trainer


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
    pixels = (img * 255).round() / 255
    solarized = apply_op("solarize", pixels, 5)  # 8-bit values >= 128 are inverted
    assert torch.equal(solarized, torch.where(pixels * 255 >= 127.5, 1 - pixels, pixels))
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


def pil_image(seed=0, size=(20, 16), mode="RGB"):
    """Random 8-bit pixels in [40, 200) as a PIL image (``size`` is width, height)."""
    g = torch.Generator().manual_seed(seed)
    bands = 3 if mode == "RGB" else 1
    pixels = torch.randint(40, 200, (size[1], size[0], bands), generator=g, dtype=torch.uint8)
    return Image.frombytes(mode, size, pixels.numpy().tobytes())


def pixels_of(img):
    """(C, H, W) float pixel values of a PIL image."""
    width, height = img.size
    raw = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
    return raw.view(height, width, -1).permute(2, 0, 1).float()


# Point and shift ops agree pixel for pixel with the tensor ops; the enhancing ops up to
# PIL's 8-bit rounding; autocontrast up to PIL's truncation.
EXACT = ["equalize", "posterize", "solarize", "translate_x", "translate_y"]
ROUNDED = ["autocontrast", "brightness", "color", "contrast", "sharpness"]


@pytest.mark.parametrize("name", EXACT + ROUNDED)
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_pil_ops_compute_what_the_tensor_ops_compute(name, mode):
    img = pil_image(mode=mode)
    for level in (3.0, 9.0):
        torch.manual_seed(1)  # the same random direction for both
        out = pil_ops().apply_pil_op(name, img, level)
        torch.manual_seed(1)
        expected = apply_op(name, pixels_of(img) / 255, level) * 255
        assert out.mode == mode and out.size == img.size
        tolerance = 0.0 if name in EXACT else 1.5
        assert (pixels_of(out) - expected).abs().max() <= tolerance + 1e-3


def test_pil_geometric_ops_agree_away_from_the_borders():
    # A smooth image: rotation and shear resample it nearly alike in PIL and in torch.
    yy, xx = torch.meshgrid(torch.arange(24), torch.arange(40), indexing="ij")
    grid = torch.stack([xx * 6, yy * 10, (xx + yy) * 4], -1).to(torch.uint8)
    img = Image.frombytes("RGB", (40, 24), grid.numpy().tobytes())
    for name in ("rotate", "shear_x", "shear_y"):
        torch.manual_seed(2)
        out = pixels_of(pil_ops().apply_pil_op(name, img, 6.0))
        torch.manual_seed(2)
        expected = apply_op(name, pixels_of(img) / 255, 6.0) * 255
        assert (out - expected)[:, 3:-3, 3:-3].abs().mean() < 2.0, name


def test_transform_on_pil_images_and_tensors():
    transform = RandAugmentTransform(num_ops=2, magnitude=9)
    img = pil_image()
    torch.manual_seed(0)
    out = transform(img)
    assert isinstance(out, Image.Image) and out.size == img.size and out.mode == "RGB"
    torch.manual_seed(0)
    assert transform(img).tobytes() == out.tobytes()  # torch's seed decides
    outs = {transform(img).tobytes() for _ in range(8)}
    assert len(outs) > 4
    tensor = pixels_of(img) / 255
    assert transform(tensor).shape == tensor.shape
    torch.manual_seed(3)
    by_transform = transform(tensor)
    torch.manual_seed(3)
    assert torch.equal(by_transform, randaugment_image(tensor, num_ops=2, magnitude=9))
    with pytest.raises(ValueError, match="works on RGB and grayscale"):
        transform(img.convert("RGBA"))
    with pytest.raises(ValueError, match=r"needs pixel values in \[0, 1\]"):
        transform(tensor * 255)
    assert "magnitude=9" in repr(transform)


def fake_data(transform):
    return FakeData(size=16, image_size=(3, 12, 12), num_classes=2, transform=transform)


def small_net():
    return Classifier(nn.Sequential(nn.Flatten(), nn.Linear(3 * 144, 2)), num_classes=2)


def fit(dataset, algorithm, batches="2ba"):
    trainer = Trainer(
        model=small_net(),
        train_dataloader=DataLoader(dataset, batch_size=8),
        max_duration=batches,
        algorithms=[algorithm],
        progress_bar=False,
        device="cpu",
    )
    trainer.fit()
    return trainer


@pytest.mark.parametrize(
    ("transform", "expected"),
    [
        (
            lambda: T.Compose([T.RandomHorizontalFlip(), T.ToTensor()]),
            [T.RandomHorizontalFlip, RandAugmentTransform, T.ToTensor],
        ),
        (lambda: T.ToTensor(), [RandAugmentTransform, T.ToTensor]),
        (
            lambda: T.Compose([T.PILToTensor(), T.ConvertImageDtype(torch.float32)]),
            [RandAugmentTransform, T.PILToTensor, T.ConvertImageDtype],
        ),
    ],
)
def test_batch_false_puts_the_transform_before_to_tensor_once(transform, expected):
    dataset = fake_data(transform())
    algorithm = RandAugment(batch=False)
    trainer = fit(dataset, algorithm)
    assert [type(t) for t in dataset.transform.transforms] == expected
    trainer.fit(duration="2ba")  # a second fit adds nothing
    assert [type(t) for t in dataset.transform.transforms] == expected
    assert trainer.state.timestamp.batch == 4


def test_batch_false_augments_what_the_dataset_returns():
    plain = fake_data(T.ToTensor())
    augmented = fake_data(T.ToTensor())
    fit(augmented, RandAugment(batch=False, num_ops=3))
    differ = sum(not torch.equal(plain[i][0], augmented[i][0]) for i in range(16))
    assert differ >= 12


def test_batch_false_needs_a_dataset_with_transforms():
    data = TensorDataset(torch.rand(16, 3, 12, 12), torch.zeros(16, dtype=torch.long))
    # (The engine may wrap an algorithm's error with the event it failed at.)
    with pytest.raises(
        (TypeError, RuntimeError), match=r"must have a `transform` attribute .*got TensorDataset"
    ):
        fit(data, RandAugment(batch=False))


def test_missing_pillow_or_torchvision_says_how_to_install_it(monkeypatch):
    import trainkit.algorithms
    from trainkit.algorithms import _vision

    monkeypatch.delitem(sys.modules, "trainkit.algorithms._pil_ops", raising=False)
    monkeypatch.delattr(trainkit.algorithms, "_pil_ops", raising=False)
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match=r'pip install "trainkit-algorithms\[vision\]"'):
        randaugment_image(pil_image())
    monkeypatch.setitem(sys.modules, "torchvision.transforms", None)
    with pytest.raises(
        ImportError, match=r"randaugment with batch=False needs torchvision.*\[vision\]"
    ):
        _vision.require_torchvision("randaugment with batch=False")
