"""Time to quality of training methods on the embedded task: how soon each reaches the
held-out bits/byte the baseline ends at.

The task is `trainkit train`'s default run (a byte-level GPT-2 on Python source, sized for
the machine): the baseline is that run for ``--budget`` seconds of training; a variant is
the same run with one method (`VARIANTS`) or a composition of them named with ``+``
(``relu_squared+rotary``: each part's change applied in turn). Every run evaluates the held-out bytes
at fixed wall-clock marks (every ``--budget / --marks`` seconds of training; evaluation
time is not training time) and runs in a fresh process. Seeds go in rounds, and within a
round the variants take turns in a rotated order, so a slow spell of a shared machine falls
on all of them.

For each seed, the target is the baseline's final held-out bits/byte; a variant's time to
quality is the training time at which it first reaches that target (linear between the
marks), as a ratio to the baseline's own time to it. The report gives the median ratio over
seeds with its range, the final bits/byte at equal budget, and "not reached" where a
variant never got there. A ratio >= 1 is a result, not a failure.

    uv run python bench/time_to_quality.py                          # 230 s, 3 seeds, all
    uv run python bench/time_to_quality.py --budget 60 --seeds 1 --variants baseline,ema
    uv run python bench/time_to_quality.py --variants baseline,relu_squared+rotary+wsd
    uv run python bench/time_to_quality.py --json out.json && ... --report out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULT = "RESULT "
Patch = Callable[[dict[str, Any]], None]


def _algorithm(name: str, **fields: Any) -> Patch:
    return lambda config: config.setdefault("algorithms", []).append({"name": name, **fields})


def _optimizer(name: str, **fields: Any) -> Patch:
    return lambda config: config.__setitem__("optimizers", {"name": name, **fields})


def _schedule(name: str, **fields: Any) -> Patch:
    return lambda config: config.__setitem__("schedulers", [{"name": name, **fields}])


def _recipe(name: str) -> Patch:
    """``recipe: name``, as ``trainkit train --recipe name`` gives it (the recipe's schedule,
    if it sets one, in place of the default's)."""

    def patch(config: dict[str, Any]) -> None:
        from trainkit.cli._recipe import recipe_sections

        config["recipe"] = name
        if "schedulers" in recipe_sections(name):
            config.pop("schedulers", None)

    return patch


# name -> (entry points it needs, as "group:name"; the change to the default run's config)
VARIANTS: dict[str, tuple[tuple[str, ...], Patch]] = {
    "baseline": ((), lambda config: None),
    "ema": (("trainkit.algorithms:ema",), _algorithm("ema", half_life="50ba")),
    "seq_length_warmup": (
        ("trainkit.algorithms:seq_length_warmup",),
        _algorithm(
            "seq_length_warmup", duration=0.2, min_seq_length=16, max_seq_length=128, step_size=16
        ),
    ),
    "alibi": (("trainkit.algorithms:alibi",), _algorithm("alibi", max_sequence_length=512)),
    "gradient_clipping": (
        ("trainkit.algorithms:gradient_clipping",),
        _algorithm("gradient_clipping", clipping_type="norm", clipping_threshold=1.0),
    ),
    "relu_squared": (("trainkit.algorithms:relu_squared",), _algorithm("relu_squared")),
    "qk_norm": (("trainkit.algorithms:qk_norm",), _algorithm("qk_norm")),
    "rotary": (("trainkit.algorithms:rotary",), _algorithm("rotary")),
    "batch_size_warmup": (
        ("trainkit.algorithms:batch_size_warmup",),
        _algorithm("batch_size_warmup"),
    ),
    # Muon on the matrices at its usual rate; AdamW's part at the baseline's rate (its
    # default, 3e-4, is for larger models than the embedded task's).
    "muon": (("trainkit.optimizers:muon",), _optimizer("muon", adamw_lr=2e-3)),
    "wsd": (("trainkit.schedulers:wsd",), _schedule("wsd", t_warmup="0.05dur")),
    # The named recipe, from its registry entry (trainkit.algorithms.recipes).
    "lm_fast": (("trainkit.recipes:lm_fast",), _recipe("lm_fast")),
}


def parts(variant: str) -> list[str]:
    """The methods a variant composes: ``"a+b"`` is ``a`` then ``b``."""
    return [part.strip() for part in variant.split("+")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=230.0, help="seconds of training per run")
    parser.add_argument("--marks", type=int, default=10, help="evaluations per run")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    parser.add_argument("--eval-bytes", type=int, default=32768, help="held-out bytes scored")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="torch threads per run (all)"
    )
    parser.add_argument("--json", default=None, help="also write every run's marks here")
    parser.add_argument("--report", default=None, metavar="JSON", help="only report a --json")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted({p for v in args.variants for p in parts(v)} - set(VARIANTS))
    if unknown:
        parser.error(
            f"unknown variants {unknown}; choose from {list(VARIANTS)}, or join them with '+'"
        )
    if "baseline" not in args.variants:
        parser.error("the variants must include baseline: the target is its final bits/byte")
    if args.budget <= 0 or args.marks < 1 or args.seeds < 1:
        parser.error("--budget must be > 0, --marks and --seeds at least 1")
    return args


# --- one run, in its own process ----------------------------------------------------------


def run_worker(args: argparse.Namespace) -> dict[str, Any]:
    """``args.worker`` = "variant:seed": train it, evaluating at every mark."""
    import torch

    from trainkit.cli._build import build_run
    from trainkit.cli._config import load_config
    from trainkit.cli._default import HeldOutWindows, compressor_baselines, python_sources
    from trainkit.cli._plan import default_config, preset
    from trainkit.cli._trainer import trainer_class
    from trainkit.core import Callback

    variant, seed = args.worker.rsplit(":", 1)
    plan = preset()
    torch.set_num_threads(args.threads)
    config = default_config(plan, generate=False)
    config["checkpoint"] = None
    config["data"]["eval_bytes"] = args.eval_bytes
    config["trainer"].update(
        max_duration=f"{args.budget}sec",
        eval_interval=f"{args.budget / args.marks}sec",
        seed=int(seed),
        progress_bar=False,
    )
    for part in parts(variant):
        VARIANTS[part][1](config)
    marks: list[tuple[float, float]] = []

    class Marks(Callback):
        def eval_end(self, state: Any, logger: Any) -> None:
            metric = state.eval_metrics[state.dataloader_label]["bits_per_byte"]
            marks.append((float(state.timestamp.total_wct), float(metric.compute())))

    with tempfile.TemporaryDirectory() as folder:
        run = build_run(load_config(None, [], base=config, run_dir=Path(folder)))
        run.config.callbacks = [*run.config.callbacks, Marks()]
        trainer = trainer_class()(run.config)
        trainer.fit()
        trainer.close()
    result: dict[str, Any] = {"variant": variant, "seed": int(seed), "marks": marks}
    # The compressors on the same held-out bytes, for scale (milliseconds).
    data = config["data"]
    _, held_out, _ = python_sources(args.eval_bytes, data["max_bytes"], data["site_packages"])
    scored = HeldOutWindows(held_out, data["seq_len"], max(1, data["seq_len"] // 2))
    result["compressors"] = compressor_baselines(scored.scored_bytes())
    return result


def measure(variant: str, seed: int, argv: list[str]) -> dict[str, Any]:
    command = [sys.executable, __file__, *argv, "--worker", f"{variant}:{seed}"]
    done = subprocess.run(command, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT) :])
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"variant": variant, "seed": seed, "error": f"exit {done.returncode}: {tail[0][:300]}"}


# --- the report ---------------------------------------------------------------------------


def time_to(marks: list[tuple[float, float]], target: float) -> float | None:
    """The training time at which ``marks`` (time, bits/byte) first reach ``target``, linear
    between the marks (from the first mark's value at its time); None if never."""
    previous = None
    for seconds, bits in marks:
        if bits <= target:
            if previous is None or previous[1] == bits:
                return seconds
            (t0, b0) = previous
            return t0 + (seconds - t0) * (b0 - target) / (b0 - bits)
        previous = (seconds, bits)
    return None


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant: time-to-quality ratios against the baseline of the same seed, and the
    final bits/byte."""
    ok = [r for r in runs if "error" not in r and r["marks"]]
    baselines = {r["seed"]: r for r in ok if r["variant"] == "baseline"}
    summary: dict[str, dict[str, Any]] = {}
    for run in ok:
        base = baselines.get(run["seed"])
        if base is None:
            continue
        target = base["marks"][-1][1]
        reference = time_to(base["marks"], target)
        reached = time_to(run["marks"], target)
        entry = summary.setdefault(run["variant"], {"ratios": [], "finals": [], "missed": 0})
        entry["finals"].append(run["marks"][-1][1])
        if reached is None or not reference:
            entry["missed"] += 1
        else:
            entry["ratios"].append(reached / reference)
    return summary


def report(runs: list[dict[str, Any]], budget: float) -> None:
    summary = summarise(runs)
    errors = [r for r in runs if "error" in r]
    print(f"time to the baseline's final held-out bits/byte ({budget:.0f} s of training a run)")
    print(f"{'variant':20s} {'ratio':>7s} {'range':>13s} {'final bits/byte':>16s} {'seeds':>6s}")
    for variant, entry in summary.items():
        ratios, finals = sorted(entry["ratios"]), entry["finals"]
        ratio = f"{statistics.median(ratios):7.3f}" if ratios else "    n/a"
        spread = f"{ratios[0]:.3f}-{ratios[-1]:.3f}" if len(ratios) > 1 else ""
        missed = f" ({entry['missed']} not reached)" if entry["missed"] else ""
        print(
            f"{variant:20s} {ratio} {spread:>13s} {statistics.median(finals):16.4f} "
            f"{len(finals):6d}{missed}"
        )
    compressors = next((r["compressors"] for r in runs if "compressors" in r), {})
    if compressors:
        shown = ", ".join(f"{name} {bits:.4f}" for name, bits in compressors.items())
        print(f"on the same held-out bytes: {shown} bits/byte")
    for run in errors:
        print(f"{run['variant']} seed {run['seed']}: {run['error']}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        print(RESULT + json.dumps(run_worker(args)), flush=True)
        return 0
    if args.report:
        with open(args.report) as file:
            saved = json.load(file)
        report(saved["runs"], saved["budget"])
        return 0
    from trainkit.core import plugins

    variants = []
    for variant in args.variants:
        missing = [
            need
            for part in parts(variant)
            for need in VARIANTS[part][0]
            if need.split(":")[1] not in plugins.available(need.split(":")[0])
        ]
        if missing:
            print(f"  {variant}: not installed ({', '.join(missing)}); skipped")
        else:
            variants.append(variant)
    worker = [
        "--budget", str(args.budget), "--marks", str(args.marks), "--eval-bytes", str(args.eval_bytes),
        "--threads", str(args.threads),
        "--variants", ",".join(variants),
    ]  # fmt: skip
    runs: list[dict[str, Any]] = []
    for seed in range(args.seeds):
        order = variants[seed % len(variants) :] + variants[: seed % len(variants)]
        for variant in order:
            started = time.perf_counter()
            run = measure(variant, seed, worker)
            runs.append(run)
            last = f"{run['marks'][-1][1]:.4f} bits/byte" if run.get("marks") else run.get("error")
            print(
                f"  seed {seed} {variant}: {last} ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
            if args.json:
                with open(args.json, "w") as file:
                    json.dump({"budget": args.budget, "runs": runs}, file, indent=1)
    report(runs, args.budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
