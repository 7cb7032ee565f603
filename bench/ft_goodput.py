"""Committed steps of a fault-tolerant run with a group killed every K steps, over the steps
a run without kills makes in the same wall time (issue 55; target >= 0.9).

Both runs train the same small classifier on ``--groups`` replica groups (one process each,
forked, around a torchft lighthouse; tests/ft_chaos.py) for the same number of committed
steps, each forward taking ``--step-time`` seconds. In the run with kills, group
``--groups - 1`` is SIGKILLed in the middle of a step after every ``--kill-every``
committed steps of each of its lives (``--kills`` times) and started again at once; the
others never stop. Wall time runs from the first committed step to the last (process start
is the same in both runs). Steps in equal wall time: committed / (clean rate x wall time
with kills) = clean wall time / wall time with kills.

    uv run python bench/ft_goodput.py
    uv run python bench/ft_goodput.py --kills 6 --kill-every 10 --samples 480
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))

from ft_chaos import ChaosRun, run_chaos


def _wall(results) -> tuple[int, float]:
    survivors = [r for g, r in results.items() if r.incarnations == 1]
    steps = max(r.steps[-1]["batch"] for r in survivors)
    start = min(r.steps[0]["time"] for r in survivors)
    end = max(r.steps[-1]["time"] for r in survivors)
    return steps, end - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--kills", type=int, default=4)
    parser.add_argument("--kill-every", type=int, default=8, help="committed steps per life")
    parser.add_argument("--samples", type=int, default=360, help="samples per epoch")
    parser.add_argument("--batch-size", type=int, default=4, help="per group")
    parser.add_argument("--steps", type=int, default=120, help="committed steps per run")
    parser.add_argument("--step-time", type=float, default=0.1, help="seconds per forward")
    parser.add_argument("--heartbeat-ms", type=int, default=500, help="lighthouse timeout")
    args = parser.parse_args()
    figures = {}
    for name, kills in (("clean", 0), ("kills", args.kills)):
        with tempfile.TemporaryDirectory() as folder:
            run = ChaosRun(
                folder=Path(folder),
                groups=args.groups,
                victim=args.groups - 1 if kills else None,
                kill_every=args.kill_every,
                kills=kills,
                samples=args.samples,
                batch_size=args.batch_size,
                max_duration=f"{args.steps}ba",
                step_time=args.step_time,
                heartbeat_ms=args.heartbeat_ms,
                deadline=600,
            )
            results = run_chaos(run)
            steps, wall = _wall(results)
            figures[name] = (steps, wall)
            lives = results[args.groups - 1].incarnations
            print(f"{name}: {steps} committed steps in {wall:.2f} s; victim lives: {lives}")
    (clean_steps, clean_wall), (steps, wall) = figures["clean"], figures["kills"]
    assert clean_steps == steps, (clean_steps, steps)
    ratio = clean_wall / wall
    print(
        f"committed steps with {args.kills} kills / steps without kills in the same wall time: "
        f"{ratio:.3f} (target >= 0.9)"
    )


if __name__ == "__main__":
    main()
