"""Python function calls and bytecodes per training step: Trainer vs a hand-written loop.

A deterministic companion to step_time.py: wall-clock ratios on a shared machine scatter
widely, counts do not. Both loops train the same tiny MLP on the same data; then both run
the null model of step_time.py (nothing to compute), where the Trainer's extra bytecodes
are the whole of its per-step Python, listed by function.

    uv run python bench/step_calls.py [--steps 200] [--top 12] [--goodput]
"""

from __future__ import annotations

import argparse
import collections
import copy
import cProfile
import pstats
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from step_time import null_setup
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainkit.trainer import Classifier, Trainer
from trainkit.trainer._private import loop_private


def calls(fn: Callable[[], None]) -> int:
    profile = cProfile.Profile()
    profile.enable()
    fn()
    profile.disable()
    return pstats.Stats(profile).total_calls


def bytecodes(fn: Callable[[], None]) -> collections.Counter:
    """Bytecodes executed by ``fn()``, per function (``file:line name``)."""
    counts: collections.Counter = collections.Counter()

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            counts[
                f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno} {code.co_name}"
            ] += 1
        return trace

    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(None)
    return counts


def compare(
    label: str, raw: Callable[[], None], trainkit: Callable[[], None], steps: int
) -> tuple[collections.Counter, collections.Counter]:
    raw(), trainkit()  # warm-up
    raw_calls, tk_calls = calls(raw) / steps, calls(trainkit) / steps
    raw_ops, tk_ops = bytecodes(raw), bytecodes(trainkit)
    raw_total, tk_total = sum(raw_ops.values()) / steps, sum(tk_ops.values()) / steps
    print(
        f"{label}: Python calls per step raw {raw_calls:.0f}, Trainer {tk_calls:.0f} "
        f"(+{tk_calls - raw_calls:.0f}); bytecodes per step raw {raw_total:.0f}, "
        f"Trainer {tk_total:.0f} (+{tk_total - raw_total:.0f}, {tk_total / raw_total:.2f}x)"
    )
    return tk_ops, raw_ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--top", type=int, default=12, help="functions listed for the null model")
    parser.add_argument(
        "--goodput", action="store_true", help="also what the goodput bookkeeping adds per step"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    steps = args.steps
    data = TensorDataset(torch.randn(steps * 64, 32), torch.randint(0, 10, (steps * 64,)))
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

    compare("MLP", raw_epoch, lambda: trainer.fit(duration=f"{steps}ba"), steps)

    batches, null_model, null_optimizer, null_trainer = null_setup(steps)

    def null_loop() -> None:
        for batch in batches:
            null_optimizer.zero_grad(set_to_none=True)
            null_model.loss(null_model(batch), batch).backward()
            null_optimizer.step()

    tk_ops, raw_ops = compare(
        "null model", null_loop, lambda: null_trainer.fit(duration=f"{steps}ba"), steps
    )
    extra = collections.Counter(tk_ops)
    extra.subtract(raw_ops)
    print(f"null model: the Trainer's extra bytecodes per step, by function (top {args.top}):")
    for name, count in extra.most_common(args.top):
        print(f"  {count / steps:7.1f}  {name}")
    if args.goodput:
        goodput_cost(null_trainer, steps)


def goodput_cost(trainer: Trainer, steps: int) -> None:
    """What the goodput bookkeeping adds per step: the same Trainer with its tracker as a
    run with a checkpoint folder has it (the heartbeat page mapped), then without it."""
    private = loop_private(trainer.state)
    tracker = private.goodput
    assert tracker is not None, "rank 0 of a Trainer's run keeps a goodput tracker"

    def fit() -> None:
        trainer.fit(duration=f"{steps}ba")

    with tempfile.TemporaryDirectory() as folder:
        tracker._open_files(Path(folder))  # as in a run with a checkpoint folder
        with_calls, with_ops = calls(fit) / steps, sum(bytecodes(fit).values()) / steps
        private.goodput = None
        without_calls, without_ops = calls(fit) / steps, sum(bytecodes(fit).values()) / steps
        private.goodput = tracker
        tracker.close()
    print(
        f"goodput bookkeeping (null model, heartbeat mapped; a record per fit): "
        f"+{with_calls - without_calls:.1f} calls, +{with_ops - without_ops:.1f} bytecodes per step"
    )


if __name__ == "__main__":
    main()
