"""Per-step time of `trainkit.trainer.Trainer` against a hand-written PyTorch loop, in one run.

Both train the same tiny MLP with AdamW, iterating a DataLoader over the same in-memory
TensorDataset with the same batch size, one epoch of ``--steps`` batches per repeat. The
Trainer runs with no progress bar, no loggers, no eval and no train metrics, so the two do
the same work and the difference is the loop's own overhead (events, timestamp,
bookkeeping). Before every repeat both start from the same weights and optimizer state,
and the data is not shuffled, so both compute bit-for-bit the same thing (checked): a
model drifting into slower numerics (denormals) cannot favour either side. Repeats
alternate between the two (and which goes first), after a warm-up of each; the figure is
the median of per-repeat ratios.

    uv run python bench/step_time.py
    uv run python bench/step_time.py --steps 500 --repeats 21 --threads 2
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainkit.core import Timestamp
from trainkit.trainer import Classifier, Trainer

TARGET_RATIO = 1.05


class Sample(NamedTuple):
    wall: float
    cpu: float


def timed(run: Callable[[], None], steps: int) -> Sample:
    """Seconds per step of ``run()``, by the wall clock and by this process's CPU time."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return Sample((time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps)


def make_mlp(features: int, hidden: int, classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, classes),
    )  # fmt: skip


def raw_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader) -> int:
    steps = 0
    for inputs, targets in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        steps += 1
    return steps


def summarize(times: dict[str, list[Sample]], clock: str) -> float:
    """Print the per-repeat ratios and median step times by ``clock``; return the median ratio."""
    raw, tk = ([getattr(s, clock) for s in times[k]] for k in ("raw", "trainkit"))
    ratios = [t / r for t, r in zip(tk, raw, strict=True)]
    extra = statistics.median(t - r for t, r in zip(tk, raw, strict=True))
    print(f"{clock:4s} ratios per repeat: {' '.join(f'{r:.3f}' for r in ratios)}")
    print(
        f"{clock:4s} median step time: raw {statistics.median(raw) * 1e6:.1f} us, "
        f"trainkit {statistics.median(tk) * 1e6:.1f} us, paired extra {extra * 1e6:+.1f} us/step"
    )
    return statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="batches per repeat (one epoch)")
    parser.add_argument("--repeats", type=int, default=15, help="timed repeats of each loop")
    parser.add_argument(
        "--null-repeats", type=int, default=60, help="timed repeats of the null-model loops"
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--train-metrics",
        action="store_true",
        help="keep Classifier's default train accuracy (work the raw loop does not do)",
    )
    parser.add_argument(
        "--components",
        action="store_true",
        help="also the null model's overhead with a progress bar, and with GradientClipping "
        "(against a hand-written loop that clips); needs trainkit-loggers and -algorithms",
    )
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    features, classes = 32, 10
    samples = args.steps * args.batch_size
    dataset = TensorDataset(torch.randn(samples, features), torch.randint(0, classes, (samples,)))

    raw_model = make_mlp(features, args.hidden, classes)
    raw_optimizer = torch.optim.AdamW(raw_model.parameters(), lr=1e-3)
    raw_loader = DataLoader(dataset, batch_size=args.batch_size)

    model = Classifier(copy.deepcopy(raw_model), train_metrics=None if args.train_metrics else {})
    tk_optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trainer = Trainer(
        model=model,
        train_dataloader=DataLoader(dataset, batch_size=args.batch_size),
        max_duration=None,
        optimizers=tk_optimizer,
        device="cpu",
        seed=0,
        progress_bar=False,
    )

    def run_raw() -> None:
        assert raw_epoch(raw_model, raw_optimizer, raw_loader) == args.steps

    def run_trainkit() -> None:
        before = trainer.state.timestamp.batch
        trainer.fit(duration=f"{args.steps}ba")
        assert trainer.state.timestamp.batch - before == args.steps

    run_raw(), run_trainkit()  # warm-up: first AdamW step imports, allocator, caches
    start = copy.deepcopy((raw_model.state_dict(), raw_optimizer.state_dict()))

    def reset() -> None:
        for module, optimizer in ((raw_model, raw_optimizer), (model.module, tk_optimizer)):
            module.load_state_dict(start[0])
            optimizer.load_state_dict(copy.deepcopy(start[1]))

    times: dict[str, list[Sample]] = {"raw": [], "trainkit": []}
    for repeat in range(args.repeats):
        reset()
        order = [("raw", run_raw), ("trainkit", run_trainkit)]
        for name, run in order[:: -1 if repeat % 2 else 1]:
            times[name].append(timed(run, args.steps))
    trainer.close()
    same = all(
        torch.equal(a, b)
        for a, b in zip(raw_model.parameters(), model.module.parameters(), strict=True)
    )

    params = sum(p.numel() for p in raw_model.parameters())
    print(
        f"setup: MLP {features}-{args.hidden}-{args.hidden}-{classes} ({params} params), "
        f"batch {args.batch_size}, AdamW, {args.steps} steps x {args.repeats} repeats, "
        f"{args.threads} thread(s), train metrics {'on' if args.train_metrics else 'off'}, "
        f"identical weights after each repeat: {same}"
    )
    wall, cpu = summarize(times, "wall"), summarize(times, "cpu")
    verdict = "OK" if wall <= TARGET_RATIO else "ABOVE TARGET"
    print(
        f"step time ratio trainkit/raw (median of {args.repeats}): {wall:.3f} wall, "
        f"{cpu:.3f} cpu (target <= {TARGET_RATIO}: {verdict})"
    )
    raw_step = statistics.median(s.cpu for s in times["raw"])
    overhead, noise, books = fixed_overhead(args.steps, args.null_repeats)
    print(
        f"fixed overhead of the Trainer (null model, median of {args.null_repeats} paired repeats): "
        f"{overhead * 1e6:+.1f} us/step = {1 + overhead / raw_step:.3f} x the MLP's raw step "
        f"(target <= {TARGET_RATIO}); a second hand-written loop measures {noise * 1e6:+.1f} "
        f"us/step, one that only keeps the books (samples, Timestamp, finite loss) "
        f"{books * 1e6:+.1f} us/step"
    )
    if args.components:
        for name, extra in component_overheads(args.steps, args.null_repeats // 3).items():
            print(f"fixed overhead {name}: {extra * 1e6:+.1f} us/step")


class _Null(nn.Module):
    """One scalar parameter: forward, backward and the step cost next to nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(()))

    def forward(self, batch: object) -> torch.Tensor:
        return self.weight * 2

    def loss(self, outputs: torch.Tensor, batch: object) -> torch.Tensor:
        return outputs * outputs


def null_setup(steps: int) -> tuple[list[Any], _Null, torch.optim.Optimizer, Trainer]:
    """``steps`` batches, a null model with its SGD for the hand-written loop, and a Trainer
    over another null model (no loggers, no progress bar), for one run of ``steps`` batches
    per ``fit(duration=...)``."""
    batches = [(torch.zeros(64, 1),)] * steps
    raw_model = _Null()
    trainer = null_trainer(batches, progress_bar=False)
    return batches, raw_model, torch.optim.SGD(raw_model.parameters(), lr=0.1), trainer


def null_trainer(batches: list[Any], **options: Any) -> Trainer:
    """A Trainer over a new null model with SGD, on ``batches``, with ``options``."""
    model = _Null()
    return Trainer(
        model=model,
        train_dataloader=batches,
        max_duration=None,
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        device="cpu",
        seed=0,
        **options,
    )


def fixed_overhead(steps: int, repeats: int) -> tuple[float, float, float]:
    """Per-step seconds the Trainer adds to a loop doing the same work on a null model; the
    same figure for a second hand-written loop (what this machine's noise alone gives); and
    for a hand-written loop that keeps only the books every resumable run needs (the floor
    any trainer's overhead stands on, here).

    With nothing to compute, the difference is the loops' own Python. The loops run in turn
    (rotating which goes first), ``repeats`` times, each for ``steps`` batches (one ``fit``
    for the Trainer, so its per-fit cost is spread over them); each figure is the median
    over the repeats of the paired per-step difference in CPU time.
    """
    batches, raw_model, raw_optimizer, trainer = null_setup(steps)
    other_model, books_model = _Null(), _Null()
    other_optimizer = torch.optim.SGD(other_model.parameters(), lr=0.1)
    books_optimizer = torch.optim.SGD(books_model.parameters(), lr=0.1)

    def hand_written(model: _Null, optimizer: torch.optim.Optimizer) -> Callable[[], None]:
        def loop() -> None:
            for batch in batches:
                optimizer.zero_grad(set_to_none=True)
                model.loss(model(batch), batch).backward()
                optimizer.step()

        return loop

    def bookkeeping() -> None:
        # Counts each batch's samples, times it, advances a Timestamp, checks that the loss
        # is finite and whether the run is over: no events, no components, no resumable
        # data position, no preemption vote.
        timestamp, clock = Timestamp(), time.perf_counter
        for batch in iter(batches):
            started = clock()
            samples = batch[0].shape[0]
            books_optimizer.zero_grad(set_to_none=True)
            loss = books_model.loss(books_model(batch), batch)
            loss.backward()
            books_optimizer.step()
            timestamp = timestamp.to_next_batch(samples, 0, clock() - started)
            if not math.isfinite(loss.item()) or timestamp.batch > steps:
                break

    def trainkit_loop() -> None:
        trainer.fit(duration=f"{steps}ba")

    loops = {
        "raw": hand_written(raw_model, raw_optimizer),
        "raw again": hand_written(other_model, other_optimizer),
        "bookkeeping": bookkeeping,
        "trainkit": trainkit_loop,
    }
    times = rotating_cpu_times(loops, steps, repeats)
    trainer.close()

    def extra(name: str) -> float:
        return statistics.median(t - r for t, r in zip(times[name], times["raw"], strict=True))

    return extra("trainkit"), extra("raw again"), extra("bookkeeping")


def rotating_cpu_times(
    loops: dict[str, Callable[[], None]], steps: int, repeats: int
) -> dict[str, list[float]]:
    """CPU seconds per step of each loop, ``repeats`` times, after a warm-up of each; the
    loops run in turn, rotating which goes first."""
    times: dict[str, list[float]] = {name: [] for name in loops}
    for loop in loops.values():
        loop()  # warm-up
    names = list(loops)
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(timed(loops[name], steps).cpu)
    return times


def component_overheads(steps: int, repeats: int) -> dict[str, float]:
    """The Trainer's per-step overhead on the null model with what real runs register: the
    progress bar (printing to nowhere), and GradientClipping, each against the hand-written
    loop doing the same work (the second clips its gradients the same way)."""
    import io

    from trainkit.algorithms import GradientClipping
    from trainkit.algorithms.gradient_clipping import apply_gradient_clipping
    from trainkit.loggers import ProgressBar

    batches = [(torch.zeros(64, 1),)] * steps

    def trainer(**options: Any) -> Callable[[], None]:
        run = null_trainer(batches, **options)
        return lambda: run.fit(duration=f"{steps}ba")

    def hand_written(clip: Any = None) -> Callable[[], None]:
        model = _Null()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def loop() -> None:
            for batch in batches:
                optimizer.zero_grad(set_to_none=True)
                model.loss(model(batch), batch).backward()
                if clip is not None:
                    apply_gradient_clipping(model, clip)
                optimizer.step()

        return loop

    clipping = GradientClipping(clipping_type="norm", clipping_threshold=1.0)
    loops = {
        "raw": hand_written(),
        "raw, clipping": hand_written(clipping.config),
        "with a progress bar": trainer(
            progress_bar=False, loggers=[ProgressBar(stream=io.StringIO())]
        ),
        "with GradientClipping": trainer(progress_bar=False, algorithms=[clipping]),
    }
    times = rotating_cpu_times(loops, steps, repeats)
    baselines = {"with a progress bar": "raw", "with GradientClipping": "raw, clipping"}
    return {
        f"{name} (against {base})": statistics.median(
            t - r for t, r in zip(times[name], times[base], strict=True)
        )
        for name, base in baselines.items()
    }


if __name__ == "__main__":
    main()
