"""What `import trainkit.core` costs on top of `import torch`, in fresh interpreters.

Each repeat starts ``python -c "import torch"`` and ``python -c "import trainkit.core"``
(alternating which goes first) and times them from outside; the figure is the median of
the per-repeat differences. Interpreter start-up and torch dominate both and cancel out,
but their noise does not: a third interpreter per repeat also times the two imports from
inside (``import torch`` then ``import trainkit.core``), which isolates trainkit's own cost
with far less noise. On a busy machine trust the inside figure: the summary line says when
the between-process one is too noisy to judge.

    uv run python bench/import_time.py
    uv run python bench/import_time.py --repeats 15
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time

TARGET_MS = 100.0

_INSIDE = (
    "import time; t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); "
    "import trainkit.core; t2 = time.perf_counter(); print(t1 - t0, t2 - t1)"
)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_seconds(code: str) -> tuple[float, float]:
    """Wall-clock and CPU seconds of ``python -c code`` in a fresh interpreter."""
    wall, cpu = time.perf_counter(), _children_cpu()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - wall, _children_cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="fresh-interpreter pairs")
    args = parser.parse_args()

    run_seconds("import trainkit.core")  # warm-up: page cache, .pyc files
    times: dict[str, list[tuple[float, float]]] = {"torch": [], "core": []}
    inside_torch, inside_core = [], []
    for repeat in range(args.repeats):
        pair = [("torch", "import torch"), ("core", "import trainkit.core")]
        for name, code in pair[:: -1 if repeat % 2 else 1]:
            times[name].append(run_seconds(code))
        out = subprocess.run(
            [sys.executable, "-c", _INSIDE], check=True, capture_output=True, text=True
        ).stdout.split()
        inside_torch.append(float(out[0]))
        inside_core.append(float(out[1]))

    torch_s, core_s = ([wall for wall, _ in times[k]] for k in ("torch", "core"))
    diffs = {
        clock: [(c[i] - t[i]) * 1e3 for c, t in zip(times["core"], times["torch"], strict=True)]
        for i, clock in enumerate(("wall", "cpu"))
    }
    extra_ms = statistics.median(diffs["wall"])
    cpu_ms = statistics.median(diffs["cpu"])
    inside_ms = statistics.median(inside_core) * 1e3
    print(f"fresh python -c, {args.repeats} interleaved repeats (wall seconds):")
    print(f"  import torch:         {' '.join(f'{s:.2f}' for s in torch_s)}")
    print(f"  import trainkit.core: {' '.join(f'{s:.2f}' for s in core_s)}")
    print(
        f"  per-repeat differences: wall {min(diffs['wall']):+.0f} to {max(diffs['wall']):+.0f} ms, "
        f"cpu {min(diffs['cpu']):+.0f} to {max(diffs['cpu']):+.0f} ms (machine noise)"
    )
    print(
        f"median: import torch {statistics.median(torch_s):.3f} s, import trainkit.core "
        f"{statistics.median(core_s):.3f} s; inside one interpreter: torch "
        f"{statistics.median(inside_torch):.3f} s, then trainkit.core {inside_ms:.1f} ms"
    )
    # Between processes the figure is only meaningful when the noise is below the target.
    quartiles = statistics.quantiles(diffs["wall"], n=4)
    if quartiles[2] - quartiles[0] > TARGET_MS:
        between = f"too noisy to judge here, quartiles {quartiles[0]:+.0f}/{quartiles[2]:+.0f} ms"
    else:
        between = "OK" if extra_ms < TARGET_MS else "ABOVE TARGET"
    inside = "OK" if inside_ms < TARGET_MS else "ABOVE TARGET"
    print(
        f"import trainkit.core extra over import torch (median): {extra_ms:+.0f} ms wall "
        f"({cpu_ms:+.0f} ms cpu) between processes [{between}]; {inside_ms:.0f} ms measured "
        f"inside [{inside}] (target < {TARGET_MS:.0f} ms)"
    )


if __name__ == "__main__":
    main()
