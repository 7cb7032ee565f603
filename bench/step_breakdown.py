"""Where the Trainer's per-step overhead goes: each phase timed inside the loop, and alone.

`step_time.py` gives the total; this splits it, on the same null model (one scalar
parameter: forward, backward and the SGD step cost next to nothing, so what is left is the
loops' own work). Three views, in one run:

- **in the loop**: the Trainer's step phases (`start_batch`, `train_batch`,
  `optimizer_step`, `finish_batch`, the stop/non-finite guard) each wrapped in a timer, and
  the hand-written loop's zero_grad + forward + loss + backward and its optimizer step;
- **alone**: the Trainer's own bookkeeping functions in a tight `timeit` loop (warm caches),
  which is what their Python costs by itself;
- the two differ: alone, a function runs in a tight loop with everything it touches warm.
  `step_calls.py` counts the work itself (bytecodes per step), which under cachegrind
  accounts for the time `step_time.py` measures.

    uv run python bench/step_breakdown.py [--steps 400] [--repeats 15]
"""

from __future__ import annotations

import argparse
import collections
import time
import timeit
from collections.abc import Callable
from typing import Any

import torch
from step_time import null_setup

from trainkit.core import Event
from trainkit.trainer import _trainer as trainer_module
from trainkit.trainer._loop import start_batch

PHASES = ("start_batch", "train_batch", "optimizer_step", "finish_batch")


def _timed(spent: collections.Counter, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    clock = time.perf_counter

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += clock() - started

    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="batches per repeat")
    parser.add_argument("--repeats", type=int, default=15, help="the minimum over these counts")
    args = parser.parse_args()
    torch.set_num_threads(1)
    steps = args.steps
    batches, raw_model, raw_optimizer, trainer = null_setup(steps)
    state, engine, guard = trainer.state, trainer.engine, trainer._guard

    spent: collections.Counter = collections.Counter()
    for name in PHASES:
        setattr(trainer_module, name, _timed(spent, name, getattr(trainer_module, name)))
    guard.after_batch = _timed(spent, "guard.after_batch", guard.after_batch)
    clock = time.perf_counter

    def trainkit_repeat() -> dict[str, float]:
        spent.clear()
        started = clock()
        trainer.fit(duration=f"{steps}ba")
        total = clock() - started
        phases = {name: spent[name] for name in (*PHASES, "guard.after_batch")}
        phases["the rest (data generator, events, checks)"] = total - sum(phases.values())
        phases["total"] = total
        return phases

    def raw_repeat() -> dict[str, float]:
        forward_backward = step = 0.0
        started = clock()
        for batch in batches:
            t0 = clock()
            raw_optimizer.zero_grad(set_to_none=True)
            raw_model.loss(raw_model(batch), batch).backward()
            t1 = clock()
            raw_optimizer.step()
            step += clock() - t1
            forward_backward += t1 - t0
        total = clock() - started
        return {
            "zero_grad + forward + loss + backward": forward_backward,
            "optimizer step": step,
            "the rest (for loop)": total - forward_backward - step,
            "total": total,
        }

    def best(repeat: Callable[[], dict[str, float]]) -> dict[str, float]:
        repeat()  # warm-up
        runs = [repeat() for _ in range(args.repeats)]
        fastest = min(runs, key=lambda run: run["total"])
        return {name: seconds / steps * 1e6 for name, seconds in fastest.items()}

    tk, raw = best(trainkit_repeat), best(raw_repeat)
    print(f"null model, {steps} steps, fastest of {args.repeats} repeats, us/step")
    print("in the loop:")
    for name, us in raw.items():
        print(f"  raw      {name:<42} {us:7.1f}")
    for name, us in tk.items():
        print(f"  trainkit {name:<42} {us:7.1f}")

    batch, loss, number = batches[0], torch.zeros(()), 100_000
    timestamp = state.timestamp
    alone = {
        "start_batch": lambda: start_batch(state, engine, batch),
        "guard.after_batch": lambda: guard.after_batch(state, loss),
        "timestamp.to_next_batch": lambda: timestamp.to_next_batch(64, 0, 0.1),
        "engine.run_event (no listener)": lambda: engine.run_event(Event.BEFORE_FORWARD),
        "tensor.detach (for scale)": lambda: loss.detach(),
    }
    print(f"alone (timeit, {number} calls each):")
    for name, fn in alone.items():
        print(f"  {name:<42} {timeit.timeit(fn, number=number) / number * 1e6:7.2f}")
    print(
        f"summary: Trainer {tk['total']:.1f} vs raw {raw['total']:.1f} us/step "
        f"(+{tk['total'] - raw['total']:.1f}); inside train_batch "
        f"+{tk['train_batch'] - raw['zero_grad + forward + loss + backward']:.1f} us for the "
        "same torch calls and 8 event dispatches"
    )


if __name__ == "__main__":
    main()
