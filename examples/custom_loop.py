"""A hand-written training loop that still gets trainkit's algorithms, loggers and checkpoints.

The step is our own: two optimizers (AdamW for the body, SGD for the head) and a loss
over two forward passes (R-Drop: two dropout masks, plus a term pulling the two
predictions together). Everything around it comes from trainkit's public pieces. Run it
twice and the second run resumes where the first stopped, bitwise:

    uv run python examples/custom_loop.py --run-dir runs/custom_loop
"""

import argparse
import hashlib
import os
import signal

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainkit.algorithms import GradientClipping
from trainkit.checkpoint import Checkpointer
from trainkit.core import DataSpec, Engine, Event, Logger, State, Time
from trainkit.core.rng import seed_everything
from trainkit.loggers import FileLogger
from trainkit.trainer.loop import (
    epoch_batches,
    finish_batch,
    finish_epoch,
    prepare_run,
    start_batch,
)


def build(args: argparse.Namespace) -> Engine:
    seed_everything(args.seed)
    x = torch.randn(2048, 16)
    y = (x[:, 0] * x[:, 1] > 0).long()
    body = nn.Sequential(
        nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 64), nn.ReLU()
    )
    head = nn.Linear(64, 2)
    state = State(
        model=nn.ModuleDict({"body": body, "head": head}),
        optimizers=[
            torch.optim.AdamW(body.parameters(), lr=3e-3),
            torch.optim.SGD(head.parameters(), lr=0.05),
        ],
        train_data=DataSpec(DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)),
        max_duration=Time.from_timestring(args.max_duration),
        seed=args.seed,
        algorithms=[GradientClipping(clipping_type="norm", clipping_threshold=1.0)],
        callbacks=[
            Checkpointer(
                folder=os.path.join(args.run_dir, "checkpoints"), interval="8ba", autoresume=True
            )
        ],
    )
    return Engine(state, Logger([FileLogger(folder=args.run_dir)], state))


def step(state: State, engine: Engine) -> torch.Tensor:
    """Our own step: two dropout masks, one backward, two optimizers."""
    x, y = state.batch
    model = state.model
    for optimizer in state.optimizers:
        optimizer.zero_grad(set_to_none=True)
    engine.run_event(Event.BEFORE_FORWARD)
    first, second = model["head"](model["body"](x)), model["head"](model["body"](x))
    engine.run_event(Event.AFTER_FORWARD)
    agreement = F.mse_loss(first.softmax(-1), second.softmax(-1))
    state.loss = F.cross_entropy(first, y) + F.cross_entropy(second, y) + agreement
    engine.run_event(Event.AFTER_LOSS)
    state.loss.backward()
    engine.run_event(Event.AFTER_TRAIN_BATCH)  # gradient clipping runs here, before the steps
    for optimizer in state.optimizers:
        optimizer.step()
    return state.loss.detach()


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", default="runs/custom_loop")
    parser.add_argument("--max-duration", default="4ep")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--crash-at-batch", type=int, default=-1, help="SIGKILL itself there (to try resuming)"
    )
    args = parser.parse_args(argv)

    engine = build(args)
    state = engine.state
    prepare_run(state, engine)  # INIT ... BEFORE_LOAD: the Checkpointer resumes here
    engine.run_event(Event.FIT_START)
    loss = torch.tensor(float("nan"))  # stays so if the run was already complete
    while not state.is_done():
        for batch in epoch_batches(state, engine):
            clock = start_batch(state, engine, batch)
            loss = step(state, engine)
            finish_batch(state, engine, clock, loss)
            engine.run_event(Event.BATCH_CHECKPOINT)
            if state.timestamp.batch == args.crash_at_batch:
                os.kill(os.getpid(), signal.SIGKILL)
        finish_epoch(state, engine)
        engine.run_event(Event.EPOCH_CHECKPOINT)
    engine.run_event(Event.FIT_END)
    engine.close()
    digest = hashlib.sha256(
        b"".join(p.detach().numpy().tobytes() for p in state.model.parameters())
    ).hexdigest()
    print(
        f"trained to {state.timestamp.epoch} epochs, last loss {float(loss):.4f}, weights sha256 {digest[:16]}"
    )
    return digest


if __name__ == "__main__":
    main()
