"""``trainkit plot RUN_DIR``: loss, learning-rate and throughput curves as PNG files.

Reads the run's JSON-lines metrics (written by `FileLogger`) and writes ``loss.png``,
``lr.png``, ``throughput.png`` and ``goodput.png`` beside it (each only when the run logged
such values).
Registered as the ``plot`` entry point of ``trainkit.commands``; also runs on its own::

    python -m trainkit.loggers.plot runs/my-run
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
_RESTART = "goodput/restart_s/"
_LEDGER = "goodput.jsonl"


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


def _figure(width: float = 8) -> Any:
    # The object API (no pyplot): no global backend or figure state is touched.
    figure_module = import_extra("matplotlib.figure", "plot")
    return figure_module.Figure(figsize=(width, 4.5), dpi=100, layout="constrained")


def _draw(path: Path, ylabel: str, series: Series) -> None:
    figure = _figure()
    axes = figure.add_subplot()
    for key, (steps, values) in sorted(series.items()):
        marker = "o" if len(steps) < 30 else None
        axes.plot(steps, values, label=key, marker=marker, markersize=3)
    axes.set_xlabel("step (batches)")
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    figure.savefig(path)


def _restarts(records: list[dict]) -> list[tuple[str, dict[str, float]]]:
    """(label, {part: seconds}) for each process start in a metrics file: the Trainer logs
    its restart parts (``goodput/restart_s/<part>``) together, once, at its first step."""
    restarts = []
    for record in records:
        metrics = record.get("metrics", {})
        parts = {
            key.removeprefix(_RESTART): float(value)
            for key, value in metrics.items()
            if key.startswith(_RESTART) and key != f"{_RESTART}total"
        }
        if parts and isinstance(record.get("step"), int):
            restarts.append((f"ba {record['step']}", parts))
    return restarts


def _ledger_restarts(path: Path) -> list[tuple[str, dict[str, float]]]:
    """(label, {part: seconds}) for each process in a goodput ledger (trainkit-trainer's
    ``goodput.jsonl``: its ``start`` and ``first_step`` records carry the parts), killed
    processes included, whose metrics may not have reached the metrics file."""
    processes: dict[int, tuple[str, dict[str, float]]] = {}
    for record in read_jsonl(path):
        n, parts = record.get("n"), record.get("parts")
        if not isinstance(n, int) or not isinstance(parts, dict):
            continue
        if record.get("event") == "start":
            processes[n] = (f"from ba {record.get('batch')}", {})
        if n in processes:
            processes[n][1].update({k: float(v) for k, v in parts.items()})
    return list(processes.values())


def _find_ledger(run_dir: Path) -> Path | None:
    # The Trainer keeps it in the checkpoint folder: `trainkit train` puts that in the run's.
    for candidate in (run_dir / _LEDGER, run_dir / "checkpoints" / _LEDGER):
        if candidate.is_file():
            return candidate
    return None


def _draw_goodput(path: Path, series: Series, restarts: list[tuple[str, dict[str, float]]]) -> None:
    """The goodput fraction over the run's steps beside each process start's restart time,
    stacked by part."""
    figure = _figure(width=12)
    over_time, parts_axes = figure.subplots(1, 2, width_ratios=(3, 2))
    steps, values = series.get("goodput/fraction", ([], []))
    over_time.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3)
    over_time.set_ylim(0, 1.05)
    over_time.set_xlabel("step (batches)")
    over_time.set_ylabel("goodput (training time kept / wall time)")
    over_time.grid(alpha=0.3)
    names = list(dict.fromkeys(name for _, parts in restarts for name in parts))
    bottoms = [0.0] * len(restarts)
    positions = range(len(restarts))
    for name in names:
        heights = [parts.get(name, 0.0) for _, parts in restarts]
        parts_axes.bar(positions, heights, bottom=bottoms, label=name)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    parts_axes.set_xticks(list(positions), [label for label, _ in restarts])
    parts_axes.set_xlabel("process start")
    parts_axes.set_ylabel("restart time (s)")
    if names:
        parts_axes.legend(fontsize="small")
    parts_axes.grid(alpha=0.3, axis="y")
    figure.savefig(path)


def plot_run(
    run_dir: str | Path,
    *,
    out_dir: str | Path | None = None,
    filename: str = "metrics.jsonl",
    ledger: str | Path | None = None,
) -> list[Path]:
    """Write the PNGs for the run in ``run_dir``; returns the files written.

    ``goodput.png`` draws ``goodput/fraction`` over the steps, and the restart time of each
    process start by part, read from the run's goodput ``ledger`` (default: ``goodput.jsonl``
    in ``run_dir`` or ``run_dir/checkpoints``), else from the metrics file.

    Raises:
        FileNotFoundError: there is no ``run_dir/filename``, or no ``ledger`` given.
        ValueError: the file holds no loss, learning rate, throughput or goodput values.
    """
    source = Path(run_dir) / filename
    if not source.is_file():
        raise FileNotFoundError(
            f"no metrics file {str(source)!r}; give the folder of a run logged with "
            "FileLogger (it holds metrics.jsonl)"
        )
    if ledger is not None and not Path(ledger).is_file():
        raise FileNotFoundError(
            f"no goodput ledger {str(ledger)!r}; give the goodput.jsonl in a run's checkpoint "
            "folder, or leave it out to look in RUN_DIR and RUN_DIR/checkpoints"
        )
    ledger = Path(ledger) if ledger is not None else _find_ledger(Path(run_dir))
    records = read_jsonl(source)
    series = _series(records)
    target = Path(out_dir) if out_dir is not None else Path(run_dir)
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name, ylabel, prefixes in _FIGURES:
        chosen = {k: v for k, v in series.items() if k.startswith(prefixes)}
        if chosen:
            _draw(target / name, ylabel, chosen)
            written.append(target / name)
    restarts = _ledger_restarts(ledger) if ledger is not None else _restarts(records)
    if "goodput/fraction" in series or restarts:
        _draw_goodput(target / "goodput.png", series, restarts)
        written.append(target / "goodput.png")
    if not written:
        raise ValueError(
            f"{str(source)!r} has no loss ('loss/...'), learning rate ('lr-...'), "
            f"throughput or goodput ('goodput/...') values to plot; it has: "
            f"{sorted(series) or 'no numeric metrics'}"
        )
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """The command: ``trainkit plot RUN_DIR [--out DIR]``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="trainkit plot",
        description="Plot loss, learning rate, throughput and goodput of a run as PNG files.",
    )
    parser.add_argument("run_dir", help="the run's folder, holding metrics.jsonl")
    parser.add_argument("--out", help="where to write the PNGs (default: the run's folder)")
    parser.add_argument("--file", default="metrics.jsonl", help="metrics file name in RUN_DIR")
    parser.add_argument(
        "--ledger",
        help="the run's goodput.jsonl (default: in RUN_DIR or RUN_DIR/checkpoints, if there)",
    )
    args = parser.parse_args(argv)
    try:
        written = plot_run(args.run_dir, out_dir=args.out, filename=args.file, ledger=args.ledger)
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
