"""ImageVisualizer: input images, and segmentation predictions and targets, sent to the
destinations' log_images at the chosen batches and at each evaluation."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainkit.core import CallbackError, TrainModel
from trainkit.loggers import (
    ImageVisualizer,
    ImageVisualizerConfig,
    InMemoryLogger,
    TensorBoardLogger,
)
from trainkit.loggers._image_visualizer import as_images, color_masks
from trainkit.trainer import Trainer

CLASSES = 3


class Segmenter(TrainModel):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Conv2d(3, CLASSES, 3, padding=1)

    def forward(self, batch):
        return self.net(batch[0])

    def loss(self, outputs, batch):
        return F.cross_entropy(outputs, batch[1], ignore_index=-1)


def _data(n=32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, 8, 8, generator=generator) * 2 + 1  # normalised, not in [0, 1]
    masks = torch.randint(-1, CLASSES, (n, 8, 8), generator=generator)  # -1: ignored
    return TensorDataset(images, masks)


def _fit(visualizer, *, loggers=None, eval_dataloader=None, duration="5ba"):
    model = Segmenter()
    memory = InMemoryLogger()
    trainer = Trainer(
        model=model,
        train_dataloader=DataLoader(_data(), batch_size=8),  # 4 batches
        eval_dataloader=eval_dataloader,
        eval_interval="4ba",
        max_duration=duration,
        device="cpu",
        progress_bar=False,
        optimizers=torch.optim.SGD(model.parameters(), lr=0.0),  # the weights stay put
        callbacks=[visualizer],
        loggers=[memory, *(loggers or [])],
    )
    trainer.fit()
    trainer.close()
    return model, memory


def _rescaled(images):
    low = images.amin(dim=(1, 2, 3), keepdim=True)
    high = images.amax(dim=(1, 2, 3), keepdim=True)
    return (images - low) / (high - low)


def test_input_images_at_the_chosen_batches_and_at_each_evaluation():
    data = _data()
    evaluation = DataLoader(_data(seed=1), batch_size=8)
    _, memory = _fit(ImageVisualizer(interval="2ba", num_images=4), eval_dataloader=evaluation)
    assert [(name, step) for name, step, _ in memory.images] == [
        ("Images/Train", 1),
        ("Images/Train", 3),
        ("Images/Eval", 4),  # the first batch of the evaluation after batch 4
        ("Images/Train", 5),
        ("Images/Eval", 5),  # and of the one at the end of training
    ]
    _, _, first = memory.images[0]
    assert first.shape == (4, 3, 8, 8) and first.dtype == torch.float32
    assert torch.allclose(first, _rescaled(data.tensors[0][:4]))
    assert first.amin() == 0.0 and first.amax() == 1.0
    _, _, third = memory.images[1]  # batch 3 holds samples 16..23
    assert torch.allclose(third, _rescaled(data.tensors[0][16:20]))
    _, _, evaluated = memory.images[2]
    assert torch.allclose(evaluated, _rescaled(_data(seed=1).tensors[0][:4]))


def test_segmentation_shows_predictions_and_targets_as_colour_masks():
    data = _data()
    model, memory = _fit(
        ImageVisualizer(interval="10ba", mode="segmentation", num_images=2),
        eval_dataloader={"val": DataLoader(_data(seed=1), batch_size=8)},
        duration="1ba",
    )
    assert [(name, step) for name, step, _ in memory.images] == [
        ("Images/Train", 1),
        ("Images/Train/prediction", 1),
        ("Images/Train/target", 1),
        ("Images/Eval/val", 1),
        ("Images/Eval/val/prediction", 1),
        ("Images/Eval/val/target", 1),
    ]
    logged = {name: images for name, _, images in memory.images}
    with torch.no_grad():
        predicted = model.net(data.tensors[0][:2]).argmax(dim=1)
    assert torch.equal(logged["Images/Train/prediction"], color_masks(predicted, CLASSES))
    target = logged["Images/Train/target"]
    assert target.shape == (2, 3, 8, 8)
    assert torch.equal(target, color_masks(data.tensors[1][:2], CLASSES))
    ignored = data.tensors[1][:2] == -1
    assert ignored.any() and (target.permute(0, 2, 3, 1)[ignored] == 0).all()  # black
    # one colour per class, none of them black
    colours = color_masks(torch.arange(CLASSES).reshape(1, 1, CLASSES), CLASSES)
    assert len({tuple(c) for c in colours[0, :, 0].T.tolist()}) == CLASSES
    assert (colours > 0).all()


def test_channels_last_images_reach_the_destinations_as_nchw():
    images = torch.rand(5, 6, 7, 3)
    out = as_images(images, 2, channels_last=True, rescale=False)
    assert out.shape == (2, 3, 6, 7)
    assert torch.equal(out, images[:2].permute(0, 3, 1, 2))
    grey = as_images(torch.randint(0, 256, (4, 6, 7), dtype=torch.uint8), 4)
    assert grey.shape == (4, 1, 6, 7) and grey.max() <= 1.0


def test_tensorboard_receives_the_images(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _fit(
        ImageVisualizer(interval="2ba", num_images=2),
        loggers=[TensorBoardLogger(log_dir=tmp_path)],
        duration="3ba",
    )
    events = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    events.Reload()
    images = events.Images("Images/Train")  # a grid of the batch's images
    assert [e.step for e in images] == [1, 3]
    assert images[0].height == 8 and images[0].width >= 2 * 8


def test_a_batch_without_images_is_a_clear_error():
    from toy import blobs, loader, mlp

    trainer = Trainer(
        model=mlp(), train_dataloader=loader(blobs(32)), max_duration="1ba", device="cpu",
        progress_bar=False, callbacks=[ImageVisualizer()],
    )  # fmt: skip
    with pytest.raises(CallbackError, match=r"expects images shaped \(N, C, H, W\).*got \(16, 8\)"):
        trainer.fit()
    trainer = Trainer(
        model=mlp(), train_dataloader=loader(blobs(32)), max_duration="1ba", device="cpu",
        progress_bar=False, callbacks=[ImageVisualizer(input_key="image")],
    )  # fmt: skip
    with pytest.raises(CallbackError, match="input_key='image' does not index the batch"):
        trainer.fit()


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="mode 'masks' is not valid; use one of 'input'"):
        ImageVisualizerConfig(mode="masks")
    with pytest.raises(ValueError, match="num_images 0 is not valid"):
        ImageVisualizerConfig(num_images=0)
    with pytest.raises(ValueError, match="ImageVisualizer interval '10tok' is not valid"):
        ImageVisualizerConfig(interval="10tok")
