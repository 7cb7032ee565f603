"""A step the strategy did not commit (`ParallelStrategy.step_committed`, a fault-tolerant
strategy's skipped step) is not counted: no timestamp advance, no BATCH_END."""

from __future__ import annotations

import torch

from toy import blobs, loader, mlp
from trainkit.core import Callback, SingleProcess
from trainkit.trainer import Trainer


class EveryOtherStepFails(SingleProcess):
    """Reports every other step as not committed."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    @property
    def step_committed(self) -> bool:
        return self.attempts % 2 == 0


class Count(Callback):
    def __init__(self, strategy: EveryOtherStepFails) -> None:
        self.strategy, self.batch_ends, self.stamps = strategy, 0, []

    def after_train_batch(self, state, logger):
        self.strategy.attempts += 1

    def batch_end(self, state, logger):
        self.batch_ends += 1
        self.stamps.append(state.timestamp.batch)


def test_only_committed_steps_advance_the_timestamp():
    strategy = EveryOtherStepFails()
    count = Count(strategy)
    model = mlp()
    trainer = Trainer(
        model=model,
        train_dataloader=loader(blobs(128), batch_size=8),
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        max_duration="3ba",
        parallelism=strategy,
        callbacks=[count],
        device="cpu",
        progress_bar=False,
    )
    trainer.fit()
    assert strategy.attempts == 6
    assert count.batch_ends == 3 and count.stamps == [1, 2, 3]
    assert trainer.state.timestamp.batch == 3
