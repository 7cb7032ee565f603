"""colout: exactly the configured share of rows and columns goes; the rest keep their order."""

import pytest
import torch
import torchvision.transforms as T
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision.datasets import FakeData

from toy import loader
from trainkit.algorithms import ColOut, ColOutConfig, ColOutTransform, colout_batch
from trainkit.core import Callback, plugins
from trainkit.trainer import Classifier, Trainer


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
    with pytest.raises(ValueError, match="resize_targets needs batch=True"):
        ColOutConfig(resize_targets=True, batch=False)


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "colout") is ColOut


def coded_pil(h=20, w=30):
    """Red = row, green = column: the kept rows and columns can be read back."""
    rows = torch.arange(h).view(h, 1).expand(h, w)
    cols = torch.arange(w).view(1, w).expand(h, w)
    pixels = torch.stack([rows, cols, torch.zeros_like(rows)], -1).to(torch.uint8)
    return Image.frombytes("RGB", (w, h), pixels.numpy().tobytes())


def pixels_of(img):
    width, height = img.size
    raw = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
    return raw.view(height, width, -1).permute(2, 0, 1)


def test_transform_drops_rows_and_columns_of_a_pil_image_and_its_mask():
    torch.manual_seed(0)
    img = coded_pil()
    mask = img.getchannel("R").convert("P")
    mask.putpalette([v for i in range(256) for v in (i, 255 - i, 0)])
    out, out_mask = ColOutTransform(p_row=0.25, p_col=0.2)((img, mask))
    assert out.size == out_mask.size == (24, 15) and out.mode == "RGB"
    pixels = pixels_of(out).long()
    rows, cols = pixels[0, :, 0], pixels[1, 0, :]
    assert rows.tolist() == sorted(set(rows.tolist())) and len(rows) == 15
    assert cols.tolist() == sorted(set(cols.tolist())) and len(cols) == 24
    expected = torch.stack([rows.view(-1, 1).expand(15, 24), cols.view(1, -1).expand(15, 24)])
    assert torch.equal(pixels[:2], expected)
    assert torch.equal(pixels_of(out_mask)[0].long(), expected[0])  # the same rows and columns
    assert out_mask.mode == "P" and out_mask.getpalette() == mask.getpalette()


def test_transform_on_tensors():
    torch.manual_seed(0)
    x = coded(n=1)[0]
    out = ColOutTransform(p_row=0.5, p_col=0.5)(x)
    assert out.shape == (3, 10, 5)
    mask = (100 * torch.arange(20).view(20, 1) + torch.arange(10)).expand(20, 10)
    out, out_mask = ColOutTransform(p_row=0.5, p_col=0.5)((x, mask))
    assert out_mask.shape == (10, 5) and torch.equal(out[0].long(), out_mask)
    with pytest.raises(ValueError, match="the image and the mask at the same size"):
        ColOutTransform()((x, mask[:10]))
    with pytest.raises(ValueError, match="modes RGB, L, P"):
        ColOutTransform()(coded_pil().convert("RGBA"))


def test_batch_false_drops_in_the_dataset():
    dataset = FakeData(size=16, image_size=(3, 20, 20), num_classes=2, transform=T.ToTensor())
    shapes = []

    class Probe(Callback):
        def before_forward(self, state, logger):
            shapes.append(tuple(state.batch[0].shape[-2:]))

    net = nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(12, 2))
    Trainer(
        model=Classifier(net, num_classes=2),
        train_dataloader=DataLoader(dataset, batch_size=8),
        max_duration="2ba",
        algorithms=[ColOut(p_row=0.2, p_col=0.1, batch=False)],
        callbacks=[Probe()],
        progress_bar=False,
        device="cpu",
    ).fit()
    assert [type(t) for t in dataset.transform.transforms] == [ColOutTransform, T.ToTensor]
    assert shapes == [(16, 18), (16, 18)]
