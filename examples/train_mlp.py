"""Train a small MLP to tell three interleaved spirals apart, with trainkit.core only.

The data is generated here (seeded), so the script runs anywhere, offline, in seconds:

    uv run python examples/train_mlp.py
    uv run python examples/train_mlp.py --epochs 5 --device cpu --seed 1
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainkit.core import Callback, Logger, State
from trainkit.trainer import Classifier, Trainer
from trainkit.trainer.schedulers import CosineAnnealingWithWarmupScheduler

NUM_CLASSES = 3


def make_spirals(
    num_samples: int, *, turns: float = 1.25, noise: float = 0.02, seed: int = 0
) -> TensorDataset:
    """``num_samples`` 2-D points on ``NUM_CLASSES`` interleaved spiral arms, labelled by arm."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(num_samples) % NUM_CLASSES
    radius = torch.rand(num_samples, generator=generator)
    angle = 2 * math.pi * (turns * radius + labels / NUM_CLASSES)
    points = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=1)
    points += noise * torch.randn(num_samples, 2, generator=generator)
    return TensorDataset(points, labels)


def make_mlp(hidden: int = 64) -> nn.Module:
    return nn.Sequential(
        nn.Linear(2, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, NUM_CLASSES),
    )


class PrintEval(Callback):
    """One line per evaluation: the epoch and the eval accuracy, kept in ``accuracy``."""

    def __init__(self) -> None:
        self.accuracy = float("nan")

    def eval_end(self, state: State, logger: Logger) -> None:
        self.accuracy = float(state.eval_metrics["eval"]["accuracy"].compute())
        print(f"epoch {state.timestamp.epoch:3d}  eval accuracy {self.accuracy:.4f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15, help="training epochs (default: 15)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or mps (default: auto)")
    parser.add_argument("--seed", type=int, default=0, help="seed for data and training")
    args = parser.parse_args()

    # A model this small gains nothing from intra-op threads, and on a busy CPU waiting for
    # them can make every step many times slower.
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    dataset = make_spirals(4000, seed=args.seed)
    train_set, eval_set = torch.utils.data.random_split(
        dataset, [0.8, 0.2], generator=torch.Generator().manual_seed(args.seed)
    )
    model = Classifier(make_mlp(), num_classes=NUM_CLASSES)
    printer = PrintEval()
    trainer = Trainer(
        model=model,
        train_dataloader=DataLoader(train_set, batch_size=64, shuffle=True),
        eval_dataloader=DataLoader(eval_set, batch_size=256),
        eval_interval="1ep",
        max_duration=f"{args.epochs}ep",
        optimizers=torch.optim.AdamW(model.parameters(), lr=2e-2, weight_decay=1e-4),
        schedulers=CosineAnnealingWithWarmupScheduler(t_warmup="0.1dur", alpha_f=0.01),
        callbacks=[printer],
        device=args.device,
        seed=args.seed,
        progress_bar=False,
    )
    trainer.fit()  # evaluates after every epoch, and always at the end
    trainer.close()
    print(f"final eval accuracy: {printer.accuracy:.4f}")


if __name__ == "__main__":
    main()
