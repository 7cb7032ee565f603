"""Python function calls per training step: Trainer vs a hand-written loop.

A deterministic companion to step_time.py: wall-clock ratios on a shared machine scatter
widely, call counts do not. Both loops train the same tiny MLP on the same data.

    uv run python bench/step_calls.py [--steps 200]
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import pstats

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainkit.core import Classifier, Trainer


def calls(fn) -> int:
    profile = cProfile.Profile()
    profile.enable()
    fn()
    profile.disable()
    return pstats.Stats(profile).total_calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.steps * 64, 32), torch.randint(0, 10, (args.steps * 64,)))
    raw = nn.Sequential(
        nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
    )
    raw_optimizer = torch.optim.AdamW(raw.parameters())
    raw_loader = DataLoader(data, batch_size=64)
    model = Classifier(copy.deepcopy(raw), train_metrics={})
    trainer = Trainer(
        model=model,
        train_dataloader=DataLoader(data, batch_size=64),
        max_duration=None,
        optimizers=torch.optim.AdamW(model.parameters()),
        device="cpu",
        seed=0,
        progress_bar=False,
    )

    def raw_epoch() -> None:
        for inputs, targets in raw_loader:
            raw_optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(raw(inputs), targets).backward()
            raw_optimizer.step()

    def trainkit_epoch() -> None:
        trainer.fit(duration=f"{args.steps}ba")

    raw_epoch(), trainkit_epoch()  # warm-up
    raw_calls, tk_calls = calls(raw_epoch) / args.steps, calls(trainkit_epoch) / args.steps
    print(
        f"Python calls per step: raw loop {raw_calls:.0f}, Trainer {tk_calls:.0f} (+{tk_calls - raw_calls:.0f}, {tk_calls / raw_calls:.2f}x)"
    )


if __name__ == "__main__":
    main()
