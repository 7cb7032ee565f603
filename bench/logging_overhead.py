"""What logging and profiling cost per training step, as ratios against no logging, in one run.

Three Trainers train the same tiny MLP (AdamW, batch 64, one epoch of ``--steps`` batches per
repeat, no progress bar, no eval, no train metrics):

- ``bare``: no loggers, no callbacks: the baseline;
- ``logged``: ConsoleLogger + FileLogger (trainkit-loggers) + SpeedMonitor + MemoryMonitor
  (trainkit-profiler), all with their default settings; the console writes to /dev/null
  and the file to a temporary folder;
- ``profiler``: a Profiler whose schedule does not reach the measured batches
  (``skip_first`` beyond the run): the cost of having it installed while inactive;
- ``bare_copy``: a second bare Trainer, whose ratio to ``bare`` shows the noise of the
  measurement on this machine.

Before every repeat all three start from the same weights and optimizer state, so they
compute the same thing (checked). Repeats rotate the order, after a warm-up of each; the
figures are medians of per-repeat ratios to ``bare``, by the wall clock and by this
process's CPU time, and the ratio of the fastest repeats (the least disturbed by other
work on a shared machine).

Then the same components alone: the events of one training step and the loss logged
each step go through an `Engine` with and without them, many times, with no model; the
fastest difference is what they add to a step, whatever the model.

    uv run python bench/logging_overhead.py
    uv run python bench/logging_overhead.py --steps 500 --repeats 21
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainkit.core import DataSpec, Engine, Event, Logger, State, Time
from trainkit.loggers import ConsoleLogger, FileLogger
from trainkit.profiler import MemoryMonitor, Profiler, SpeedMonitor
from trainkit.trainer import Classifier, Trainer

TARGET_LOGGED = 1.03
TARGET_PROFILER = 1.01


def make_mlp(features: int, hidden: int, classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, classes),
    )  # fmt: skip


STEP_EVENTS = [
    Event.BEFORE_DATALOADER, Event.AFTER_DATALOADER, Event.BATCH_START,
    Event.BEFORE_TRAIN_BATCH, Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.BEFORE_LOSS,
    Event.AFTER_LOSS, Event.BEFORE_BACKWARD, Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH,
]  # fmt: skip


def hooks_per_step(callbacks: list, loggers: list, steps: int, rounds: int) -> float:
    """Fastest seconds per step of the loop's events and loss logging alone (no model)."""
    batch = (torch.zeros(64, 4), torch.zeros(64))
    state = State(model=nn.Linear(1, 1), max_duration=Time(10**12, "ba"), callbacks=callbacks)
    state.train_data, state.batch = DataSpec([batch]), batch
    logger = Logger(loggers, state)
    engine = Engine(state, logger)
    engine.run_event(Event.INIT)
    engine.run_event(Event.FIT_START)
    loss = torch.tensor(0.5)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            for event in STEP_EVENTS:
                engine.run_event(event)
            state.timestamp = state.timestamp.to_next_batch(64, 0, 1e-3)
            logger.log_metrics({"loss/train/total": loss})
            engine.run_event(Event.BATCH_END)
            engine.run_event(Event.BATCH_CHECKPOINT)
        best = min(best, (time.perf_counter() - start) / steps)
    engine.close()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="batches per repeat (one epoch)")
    parser.add_argument("--repeats", type=int, default=15, help="timed repeats of each setup")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    features, classes = 32, 10
    samples = args.steps * args.batch_size
    dataset = TensorDataset(torch.randn(samples, features), torch.randint(0, classes, (samples,)))
    template = make_mlp(features, args.hidden, classes)
    folder = tempfile.TemporaryDirectory()
    console = open(os.devnull, "w")  # noqa: SIM115 (closed at the end)

    def trainer(callbacks: list, loggers: list) -> Trainer:
        model = Classifier(copy.deepcopy(template), train_metrics={})
        return Trainer(
            model=model,
            train_dataloader=DataLoader(dataset, batch_size=args.batch_size),
            max_duration=None,
            optimizers=torch.optim.AdamW(model.parameters(), lr=1e-3),
            device="cpu",
            seed=0,
            progress_bar=False,
            callbacks=callbacks,
            loggers=loggers,
            run_name="bench",
        )

    trainers = {
        "bare": trainer([], []),
        "bare_copy": trainer([], []),  # the noise floor: it should come out at 1.000
        "logged": trainer(
            [SpeedMonitor(), MemoryMonitor()],
            [
                ConsoleLogger(stream=console),
                FileLogger(folder=os.path.join(folder.name, "{run_name}")),
            ],
        ),
        "profiler": trainer(
            [Profiler(folder=os.path.join(folder.name, "traces"), skip_first=10**9)], []
        ),
    }

    def run(name: str) -> Callable[[], tuple[float, float]]:
        def timed() -> tuple[float, float]:
            wall, cpu = time.perf_counter(), time.process_time()
            trainers[name].fit(duration=f"{args.steps}ba")
            steps = args.steps
            return (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps

        return timed

    for name in trainers:  # warm-up: first AdamW step imports, allocator, caches
        run(name)()
    start = copy.deepcopy(
        (
            trainers["bare"].state.model.module.state_dict(),
            trainers["bare"].state.optimizer.state_dict(),
        )
    )

    times: dict[str, list[tuple[float, float]]] = {name: [] for name in trainers}
    names = list(trainers)
    for repeat in range(args.repeats):
        for t in trainers.values():
            t.state.model.module.load_state_dict(start[0])
            t.state.optimizer.load_state_dict(copy.deepcopy(start[1]))
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        for name in order:
            times[name].append(run(name)())
    params = {n: list(t.state.model.parameters()) for n, t in trainers.items()}
    same = all(
        torch.equal(a, b)
        for other in ("bare_copy", "logged", "profiler")
        for a, b in zip(params["bare"], params[other], strict=True)
    )
    for t in trainers.values():
        t.close()
    console.close()
    with open(os.path.join(folder.name, "bench", "metrics.jsonl")) as written:
        lines = sum(1 for _ in written)
    folder.cleanup()

    print(
        f"setup: MLP {features}-{args.hidden}-{args.hidden}-{classes}, batch {args.batch_size}, "
        f"AdamW, {args.steps} steps x {args.repeats} repeats, {args.threads} thread(s), "
        f"identical weights after each repeat: {same}, metrics.jsonl lines written: {lines}"
    )
    for clock, index in (("wall", 0), ("cpu", 1)):
        fastest = min(t[index] for t in times["bare"])
        for name in ("bare_copy", "logged", "profiler"):
            best = min(t[index] for t in times[name]) / fastest
            print(f"{clock:4s} {name:9s} fastest repeat / fastest bare repeat: {best:.3f}")
        bare = [t[index] for t in times["bare"]]
        print(f"{clock:4s} median step time: bare {statistics.median(bare) * 1e6:.1f} us")
        for name, target in (
            ("bare_copy", None),
            ("logged", TARGET_LOGGED),
            ("profiler", TARGET_PROFILER),
        ):
            other = [t[index] for t in times[name]]
            ratios = [t / b for t, b in zip(other, bare, strict=True)]
            ratio = statistics.median(ratios)
            extra = statistics.median(t - b for t, b in zip(other, bare, strict=True))
            if target is None:
                verdict = "the noise floor: an identical Trainer"
            else:
                verdict = f"target <= {target}: {'OK' if ratio <= target else 'ABOVE TARGET'}"
            print(f"{clock:4s} {name:9s} ratios per repeat: {' '.join(f'{r:.3f}' for r in ratios)}")
            print(
                f"{clock:4s} {name:9s} step time ratio to bare (median of {args.repeats}): "
                f"{ratio:.3f}, {extra * 1e6:+.1f} us/step ({verdict})"
            )

    hooks_folder = tempfile.TemporaryDirectory()
    setups = {
        "bare": ([], []),
        "logged": (
            [SpeedMonitor(), MemoryMonitor()],
            [ConsoleLogger(stream=console), FileLogger(folder=hooks_folder.name)],
        ),
        "profiler": ([Profiler(folder=hooks_folder.name, skip_first=10**12)], []),
    }
    with open(os.devnull, "w") as console:
        setups["logged"][1][0].stream = console
        costs = {
            name: hooks_per_step(*setup, steps=500, rounds=40) for name, setup in setups.items()
        }
    hooks_folder.cleanup()
    bare_step = min(t[0] for t in times["bare"])
    print(f"hooks alone: bare loop events {costs['bare'] * 1e6:.2f} us/step")
    for name in ("logged", "profiler"):
        extra = costs[name] - costs["bare"]
        print(
            f"hooks alone: {name:8s} adds {extra * 1e6:+.2f} us/step = "
            f"{1 + extra / bare_step:.4f} x the fastest bare step ({bare_step * 1e6:.0f} us)"
        )


if __name__ == "__main__":
    main()
