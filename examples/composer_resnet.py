"""Composer's Trainer example "train a torchvision ResNet classifier with a recipe of speed-up
methods", ported to trainkit.

Every line that differs from the Composer script carries a ``# Composer:`` comment with
the line it replaces; the rest is Composer's code as it was. Not Composer's and not part of
the port: the images are made up (10 classes told apart by colour and a stripe pattern),
because nothing can be downloaded here, and ``--help`` options let the tests run it briefly.

    uv run python examples/composer_resnet.py --save-folder /tmp/resnet
"""

from __future__ import annotations

import argparse

import torch
import torchvision.models as models
from torch.utils.data import DataLoader, TensorDataset

# Composer: from composer.algorithms import BlurPool, ChannelsLast, LabelSmoothing
from trainkit.algorithms import BlurPool, ChannelsLast, LabelSmoothing

# Composer: from composer import Trainer; from composer.models import ComposerClassifier
from trainkit.trainer import Classifier, Trainer

# Composer: from composer.optim import DecoupledSGDW, MultiStepScheduler
from trainkit.trainer.optim import DecoupledSGDW
from trainkit.trainer.schedulers import MultiStepScheduler

CLASSES = 10


def images(n: int, seed: int) -> TensorDataset:
    """``n`` 32x32 RGB images; class k has its own colour and stripe frequency."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (n,), generator=generator)
    colours = torch.rand(CLASSES, 3, 1, 1, generator=torch.Generator().manual_seed(123))
    stripes = torch.sin(torch.arange(32).float()[None, :] * (labels[:, None] + 1) * 0.3)
    x = (
        colours[labels]
        + 0.5 * stripes[:, None, None, :]
        + 0.3 * torch.randn(n, 3, 32, 32, generator=generator)
    )
    return TensorDataset(x, labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save-folder", default="checkpoints")
    parser.add_argument("--max-duration", default="4ep")
    parser.add_argument("--samples", type=int, default=1024)
    args = parser.parse_args()

    torch.manual_seed(17)
    # Composer: ComposerClassifier(module=models.resnet18(num_classes=10), num_classes=10)
    model = Classifier(module=models.resnet18(num_classes=CLASSES), num_classes=CLASSES)
    train_dataloader = DataLoader(images(args.samples, seed=0), batch_size=64, shuffle=True)
    eval_dataloader = DataLoader(images(256, seed=1), batch_size=128)
    optimizer = DecoupledSGDW(model.parameters(), lr=0.02, momentum=0.9, weight_decay=5e-4)

    trainer = Trainer(
        model=model,
        train_dataloader=train_dataloader,
        eval_dataloader=eval_dataloader,
        max_duration=args.max_duration,
        optimizers=optimizer,
        schedulers=MultiStepScheduler(milestones=["0.5dur", "0.75dur"], gamma=0.1),
        algorithms=[LabelSmoothing(smoothing=0.1), BlurPool(), ChannelsLast()],
        device="gpu" if torch.cuda.is_available() else "cpu",
        precision="amp_bf16" if torch.cuda.is_available() else "fp32",
        save_folder=args.save_folder,
        save_interval="1ep",
        save_num_checkpoints_to_keep=1,
        progress_bar=False,
        log_to_console=True,
        console_log_interval="1ep",
        seed=17,
    )
    trainer.fit()
    trainer.close()
    accuracy = float(trainer.last_eval["metrics/eval/accuracy"])
    print(f"final eval accuracy: {accuracy:.4f}")


if __name__ == "__main__":
    main()
