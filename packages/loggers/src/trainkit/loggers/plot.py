"""``trainkit plot RUN_DIR``: loss, learning-rate and throughput curves as PNG files.

Reads the run's JSON-lines metrics (written by `FileLogger`) and writes ``loss.png``,
``lr.png`` and ``throughput.png`` beside it (each only when the run logged such values).
Registered as the ``plot`` entry point of ``trainkit.commands``; also runs on its own::

    python -m trainkit.loggers.plot runs/my-run
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from trainkit.loggers._common import import_extra
from trainkit.loggers._file import read_jsonl

__all__ = ["main", "plot_run"]

Series = dict[str, tuple[list[int], list[float]]]

# (file name, y label, the keys (or key prefixes) drawn on it)
_FIGURES = (
    ("loss.png", "loss", ("loss/", "metrics/eval/cross_entropy")),
    ("lr.png", "learning rate", ("lr-",)),
    ("throughput.png", "per second", ("throughput/samples_per_sec", "throughput/tokens_per_sec")),
)


def _series(records: list[dict]) -> Series:
    series: Series = {}
    for record in records:
        step = record.get("step")
        for key, value in record.get("metrics", {}).items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if isinstance(step, int) and math.isfinite(value):
                steps, values = series.setdefault(key, ([], []))
                steps.append(step)
                values.append(float(value))
    return series


def _draw(path: Path, ylabel: str, series: Series) -> None:
    # The object API (no pyplot): no global backend or figure state is touched.
    figure_module = import_extra("matplotlib.figure", "plot")
    figure = figure_module.Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    for key, (steps, values) in sorted(series.items()):
        marker = "o" if len(steps) < 30 else None
        axes.plot(steps, values, label=key, marker=marker, markersize=3)
    axes.set_xlabel("step (batches)")
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    figure.savefig(path)


def plot_run(
    run_dir: str | Path, *, out_dir: str | Path | None = None, filename: str = "metrics.jsonl"
) -> list[Path]:
    """Write the PNGs for the run in ``run_dir``; returns the files written.

    Raises:
        FileNotFoundError: there is no ``run_dir/filename``.
        ValueError: the file holds no loss, learning rate or throughput values.
    """
    source = Path(run_dir) / filename
    if not source.is_file():
        raise FileNotFoundError(
            f"no metrics file {str(source)!r}; give the folder of a run logged with "
            "FileLogger (it holds metrics.jsonl)"
        )
    series = _series(read_jsonl(source))
    target = Path(out_dir) if out_dir is not None else Path(run_dir)
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name, ylabel, prefixes in _FIGURES:
        chosen = {k: v for k, v in series.items() if k.startswith(prefixes)}
        if chosen:
            _draw(target / name, ylabel, chosen)
            written.append(target / name)
    if not written:
        raise ValueError(
            f"{str(source)!r} has no loss ('loss/...'), learning rate ('lr-...') or "
            f"throughput values to plot; it has: {sorted(series) or 'no numeric metrics'}"
        )
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """The command: ``trainkit plot RUN_DIR [--out DIR]``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="trainkit plot",
        description="Plot loss, learning rate and throughput of a run as PNG files.",
    )
    parser.add_argument("run_dir", help="the run's folder, holding metrics.jsonl")
    parser.add_argument("--out", help="where to write the PNGs (default: the run's folder)")
    parser.add_argument("--file", default="metrics.jsonl", help="metrics file name in RUN_DIR")
    args = parser.parse_args(argv)
    try:
        written = plot_run(args.run_dir, out_dir=args.out, filename=args.file)
    except (FileNotFoundError, ValueError, ImportError) as err:
        print(f"trainkit plot: {err}", file=sys.stderr)
        return 1
    for path in written:
        print(f"plot of {path.stem}: {_openable(path)}")
    return 0


def _openable(path: Path) -> Path:
    """``path`` as the user can open it from here: relative to the working directory when
    it is below it (``runs/default/loss.png``), else absolute."""
    absolute = path.resolve()
    try:
        return absolute.relative_to(Path.cwd())
    except ValueError:
        return absolute


if __name__ == "__main__":
    sys.exit(main())
