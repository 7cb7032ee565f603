"""A training loop written on trainkit-core alone, running trainkit-algorithms' methods.

No Trainer: the loop below is the whole of it. It builds a `State`, lets an `Engine` run
the algorithms at the events it fires (label smoothing changes the targets between
BEFORE_LOSS and AFTER_LOSS, gradient clipping the gradients at AFTER_TRAIN_BATCH), and
steps the optimizer through the run's `Precision`. It needs only these two packages:

    pip install ./packages/core ./packages/algorithms
    python examples/core_loop.py
"""

import argparse
from collections import Counter

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainkit.algorithms import GradientClipping, LabelSmoothing
from trainkit.core import DataSpec, Engine, Event, Logger, State, Time, TrainModel
from trainkit.core.rng import seed_everything


class Net(TrainModel):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, batch):
        return self.body(batch[0])

    def loss(self, outputs, batch):
        # Label smoothing hands the targets over as class probabilities.
        return F.cross_entropy(outputs, batch[1])


def data(n: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=generator)
    return TensorDataset(x, (x[:, 0] * x[:, 1] > 0).long())


def train_step(state: State, fire) -> torch.Tensor:
    """zero_grad, forward, loss, backward, optimizer step, with their events."""
    fire(Event.BEFORE_TRAIN_BATCH)
    for optimizer in state.optimizers:
        optimizer.zero_grad(set_to_none=True)
    with state.precision.autocast():
        fire(Event.BEFORE_FORWARD)
        state.outputs = state.model(state.batch)
        fire(Event.AFTER_FORWARD)
        fire(Event.BEFORE_LOSS)  # label smoothing: targets become smoothed probabilities
        state.loss = state.model.loss(state.outputs, state.batch)
        fire(Event.AFTER_LOSS)
    fire(Event.BEFORE_BACKWARD)
    state.precision.backward(state.loss)
    fire(Event.AFTER_BACKWARD)
    state.total_loss = state.rank_loss = state.loss.detach()
    fire(Event.AFTER_TRAIN_BATCH)  # gradient clipping, before the optimizer step
    state.precision.step(state.optimizers)
    return state.total_loss


def run(max_duration: str = "3ep", seed: int = 0) -> dict:
    seed_everything(seed)
    model = Net()
    state = State(
        model=model,
        optimizers=[torch.optim.AdamW(model.parameters(), lr=3e-3)],
        train_data=DataSpec(DataLoader(data(2048, seed), batch_size=64, shuffle=True)),
        max_duration=Time.from_timestring(max_duration),
        seed=seed,
        algorithms=[
            LabelSmoothing(smoothing=0.1),
            GradientClipping(clipping_type="norm", clipping_threshold=1.0),
        ],
    )
    engine = Engine(state, Logger([], state))
    applied: Counter[str] = Counter()

    def fire(event: Event) -> None:
        for trace in engine.run_event(event):
            applied[f"{trace.name} at {trace.event.value}"] += 1

    fire(Event.INIT)
    state.train_data.make_resumable(state.seed)
    fire(Event.FIT_START)
    losses = []
    while not state.is_done():
        fire(Event.EPOCH_START)
        for batch in state.train_data.iter_epoch(state.timestamp.epoch):
            state.batch = state.train_data.device_transfer(batch, state.device)
            fire(Event.BATCH_START)
            losses.append(float(train_step(state, fire)))
            samples, tokens = state.train_data.count_batch(state.batch, 1)
            state.timestamp = state.timestamp.to_next_batch(samples, tokens)
            fire(Event.BATCH_END)
            if state.is_done():
                break
        else:
            state.timestamp = state.timestamp.to_next_epoch()
            fire(Event.EPOCH_END)
    fire(Event.FIT_END)
    engine.close()

    held_out = data(512, seed + 1)
    with torch.no_grad():
        predictions = state.model((held_out.tensors[0],)).argmax(dim=1)
    accuracy = (predictions == held_out.tensors[1]).float().mean().item()
    return {
        "batches": state.timestamp.batch,
        "first_loss": losses[0],
        "last_loss": sum(losses[-10:]) / 10,
        "accuracy": accuracy,
        "applied": dict(applied),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-duration", default="3ep")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = run(args.max_duration, args.seed)
    print(
        f"trained {result['batches']} batches: loss {result['first_loss']:.3f} -> "
        f"{result['last_loss']:.3f}, held-out accuracy {result['accuracy']:.3f}"
    )
    return result


if __name__ == "__main__":
    main()
