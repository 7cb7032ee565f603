"""``trainkit train``: build a run from a config (or the embedded default) and train it.

Run directory layout (stable)::

    <run_dir>/config.yaml      the resolved config of the run
    <run_dir>/metrics.jsonl    every logged value, one JSON object per line (trainkit-loggers)
    <run_dir>/checkpoints/     one folder per checkpoint, plus `latest` (trainkit-checkpoint)
    <run_dir>/loss.png         the loss curves (trainkit-loggers[plot]; lr.png,
                               throughput.png and goodput.png too for a run that logs them)
    <run_dir>/sample.txt       text generated at the end (the default language model)

At the end, rank 0 gives config.yaml, sample.txt and the plots to every logger destination
under the same names (``upload_file``), e.g. as wandb artifacts or MLflow run artifacts.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from trainkit.cli._build import build_run
from trainkit.cli._config import load_config
from trainkit.cli._plan import (
    DEFAULT_RECIPE,
    Plan,
    default_config,
    default_recipe,
    preset,
    share_cores,
)
from trainkit.cli._trainer import trainer_class
from trainkit.core import Callback, dist, plugins

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train from a config, or the embedded default with none",
        description="Train a model from CONFIG (YAML), or with no CONFIG the embedded default: a "
        "byte-level GPT-2 on Python source, sized for this machine and trained for a fixed "
        "wall-clock budget. Re-running resumes.",
    )
    parser.add_argument("config", nargs="?", type=Path, help="a YAML config (default: embedded)")
    parser.add_argument("--max-duration", help="override trainer.max_duration, e.g. 2ep, 500ba")
    parser.add_argument("--run-dir", type=Path, help="where the run writes (default: runs/<name>)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. trainer.precision=amp_bf16 (repeatable)",
    )
    parser.add_argument(
        "--recipe",
        help="train with this recipe (a trainkit.recipes entry point), or 'none' for the "
        f"baseline; the embedded default uses {DEFAULT_RECIPE!r} where it is installed",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config and exit"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    overrides = list(args.set) + (
        [f"trainer.max_duration={args.max_duration}"] if args.max_duration else []
    )
    recipe = None if args.recipe in (None, "none") else args.recipe
    if args.config is not None and args.recipe is not None:
        overrides.append(f"recipe={recipe or 'null'}")
    plan = preset() if args.config is None else None
    base = None
    if plan is not None:
        base = default_config(
            plan,
            "generate" in plugins.available("trainkit.callbacks"),
            recipe=default_recipe() if args.recipe is None else recipe,
        )
    config = load_config(args.config, overrides, base=base, run_dir=args.run_dir)
    if args.print_config:
        print(config.to_yaml(portable=True), end="")
        return 0
    if config.trainer["max_duration"] is None:
        raise ValueError("trainer.max_duration is not set; say how long to train, e.g. 10ep, 500ba")
    dist.init_distributed(single_process=config.components["parallelism"] is not None)
    run_dir = config.run_dir
    if plan is not None:
        plan = _start_default(plan, str(config.trainer["max_duration"]), args.set)
    run = build_run(config)
    trainer = _build_trainer(run.config)
    # Written once the trainer is built: a run refused a folder (another run's) leaves its
    # files as they were.
    if dist.get_rank() == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(config.to_yaml())
    _say_where(run_dir, config.notes)
    first_step = _time_first_step(trainer, started)
    trainer.fit()
    # fit() ends with an evaluation; a run resumed after it finished has none yet.
    results = trainer.last_eval or (trainer.eval() if trainer.state.evaluators else {})
    if dist.get_rank() == 0:
        _finish(trainer, run_dir, results, config.components["model"].name, first_step)
    trainer.close()
    return 0


def _build_trainer(trainer_config: Any) -> Any:
    try:
        return trainer_class()(trainer_config)
    except RuntimeError as err:
        # A component refusing the run at set-up (a checkpoint folder of another model, ...)
        # is the user's to act on: said as the config's mistakes are, without a traceback.
        if isinstance(err.__cause__, ValueError):
            raise ValueError(str(err)) from err
        raise


def _say_where(run_dir: Path, notes: list[str]) -> None:
    # Where the run resumed from, the Trainer says itself.
    if dist.get_rank() != 0:
        return
    for note in notes:
        print(f"note: {note}", flush=True)
    print(f"run directory: {run_dir}", flush=True)


def _time_first_step(trainer: Any, started: float) -> list[float]:
    seen: list[float] = []

    class FirstStep(Callback):
        def batch_start(self, state: Any, logger: Any) -> None:
            if not seen:
                seen.append(time.perf_counter() - started)

    trainer.state.callbacks.append(FirstStep())
    return seen


def _start_default(plan: Plan, max_duration: str, overrides: Sequence[str]) -> Plan:
    """Choose the CPU threads (in the process group, if any), say what the run is."""
    if plan.device == "cpu":
        if dist.get_world_size() > 1:
            # Every rank measures once all have started: a rank still importing torch is
            # not other work, and counted as such it would take cores from every rank.
            dist.barrier()
        plan = share_cores(plan)
        torch.set_num_threads(plan.threads)
    if dist.get_rank() == 0:
        print(plan.describe(max_duration), flush=True)
        if overrides:  # the line above is the preset's: say what replaced it
            print(f"overridden with --set: {' '.join(overrides)}", flush=True)
        for note in plan.notes:
            print(f"note: {note}", flush=True)
    return plan


def _finish(
    trainer: Any, run_dir: Path, results: dict, model_name: str, first_step: list[float]
) -> None:
    summary = "  ".join(f"{k}: {float(v):.4f}" for k, v in results.items())
    if first_step:
        print(f"first training step {first_step[0]:.1f} s after start", flush=True)
    print(_trained(trainer.state.timestamp), flush=True)
    print(f"final evaluation: {summary or 'no eval data'}", flush=True)
    _compare_with_compressors(trainer, results)
    if "plot" in plugins.available("trainkit.commands") and (run_dir / "metrics.jsonl").exists():
        try:
            plugins.load("trainkit.commands", "plot")([str(run_dir)])
        except Exception as err:  # a missing plotting extra must not fail a finished run
            print(f"no plots: {err}", flush=True)
    sample = _sample(trainer, model_name)
    if sample is not None:
        (run_dir / "sample.txt").write_text(sample)
        print("sample:\n" + sample, flush=True)
    # The run's own files go to the logger destinations named as in the run folder (as the
    # Checkpointer's checkpoints/<name>): a file logger writing there finds them in place.
    for path in [run_dir / "config.yaml", run_dir / "sample.txt", *sorted(run_dir.glob("*.png"))]:
        if path.is_file():
            trainer.logger.upload_file(path.name, path, overwrite=True)


def _trained(timestamp: Any) -> str:
    """``trained 1436 batches (23.5M tokens) in 230 s``; tokens only where the data counts
    them (text), seconds to a tenth under ten."""
    count = timestamp.token
    tokens = (
        f" ({count / 1e6:.1f}M tokens)"
        if count >= 100_000
        else f" ({count:,} tokens)"
        if count
        else ""
    )
    seconds = timestamp.total_wct
    took = f"{seconds:.1f}" if seconds < 10 else f"{seconds:.0f}"
    return f"trained {timestamp.batch} batches{tokens} in {took} s"


def _compare_with_compressors(trainer: Any, results: dict) -> None:
    """Held-out bits/byte beside gzip -9 and xz -9 on the same bytes (logged too)."""
    from trainkit.cli._default import HeldOutWindows, compressor_baselines

    key = "metrics/eval/bits_per_byte"
    evaluators = trainer.state.evaluators
    dataset = getattr(evaluators[0].data.dataloader, "dataset", None) if evaluators else None
    if key not in results or not isinstance(dataset, HeldOutWindows):
        return
    data = dataset.scored_bytes()
    baselines = compressor_baselines(data)
    trainer.logger.log_metrics(
        {f"baseline/{name.split()[0]}_bits_per_byte": value for name, value in baselines.items()}
    )
    others = ", ".join(f"{name} {value:.3f}" for name, value in baselines.items())
    print(
        f"held-out bits/byte ({len(data):,} bytes of files never trained on): model "
        f"{float(results[key]):.3f}; {others}",
        flush=True,
    )


def _sample(trainer: Any, model_name: str) -> str | None:
    """The `Generate` callback's latest text (prompt and continuation), or for a byte-level
    model run without it, a sample drawn now."""
    if "generate" in plugins.available("trainkit.callbacks"):
        generate_class = plugins.load("trainkit.callbacks", "generate")
        for callback in trainer.state.callbacks:
            if isinstance(callback, generate_class) and callback.last_rows:
                prompt, _, text = callback.last_rows[-1]
                return prompt + text
    if model_name == "tiny_gpt2":
        from trainkit.cli._default import generate

        return generate(trainer.state.parallelism.unwrap(trainer.state.model))
    return None
