"""Tokens/s, MFU and peak memory of the trainkit Trainer against hand-written loops, in one run.

Every variant trains the same GPT-2 (built from a config, no download) on the same random
tokens, with the same batch, sequence length, precision (bf16 autocast on CUDA) and AdamW
(fused on CUDA), each in its own fresh process so its memory peak is its own:

    eager            hand-written loop
    trainer          trainkit Trainer + HuggingFaceModel
    compile          hand-written loop on torch.compile(model)
    trainer_compile  Trainer(compile=True)
    fsdp             hand-written FSDP2: fully_shard per block, then the root; one rank
                     (NCCL on CUDA, gloo on CPU), MixedPrecisionPolicy(bf16, reduce fp32)
    trainer_fsdp     Trainer(parallelism=FSDP()) on the same one-rank group
    lightning        Lightning (lightning or pytorch_lightning), when importable

Timing starts after ``--warmup`` steps (compilation included there) and a full garbage
collection, and covers ``--steps`` steps, synchronised on the device at both ends. MFU is
``6 * N * tokens/s`` over the device's dense bf16 peak (a table for H100/H200/A100, or
``--peak-tflops``), with N the parameters that do matmuls per token (all but the position
embeddings; the tied embedding counts once, as the output head). Peak memory is
``torch.cuda.max_memory_allocated`` over the whole run of the variant.

    uv run python bench/gpu_throughput.py                          # GPT-2 small, seq 1024, batch 16
    uv run python bench/gpu_throughput.py --seq 512 --batch 8 --variants eager,trainer
    uv run python bench/gpu_throughput.py --tiny                   # CPU smoke run (~2 min)
    uv run python bench/gpu_throughput.py --repeats 3 --variants eager,trainer
    uv run python bench/gpu_throughput.py --report results.json    # the table of a --json file

``--repeats`` runs the variants in interleaved rounds and reports each one's median tokens/s
(and the largest peak memory); each finished variant is printed, and written to ``--json``,
as it ends, so a run cut short keeps what it measured.

Where a gap between a pair comes from (profiles, per-phase times, one change at a time):
``bench/throughput_diagnostics.py``, which runs these variants and more.

Targets (issue 14): Trainer >= 0.99 of eager, >= 0.98 of compiled, FSDP >= 0.99 of FSDP2 by
hand, and peak memory <= the hand-written loop's + 1%.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

VARIANTS = ("eager", "trainer", "compile", "trainer_compile", "fsdp", "trainer_fsdp", "lightning")
BASELINE = {"trainer": "eager", "trainer_compile": "compile", "trainer_fsdp": "fsdp"}
SPEED_TARGET = {"trainer": 0.99, "trainer_compile": 0.98, "trainer_fsdp": 0.99}
MEMORY_TARGET = 1.01
# Dense bf16 tensor-core peaks (no sparsity), FLOP/s, matched on torch.cuda.get_device_name.
PEAK_BF16 = (
    ("H200", 989.4e12),
    ("H100 PCIe", 756.0e12),
    ("H100 NVL", 835.0e12),
    ("H100", 989.4e12),
    ("A100", 312.0e12),
)
RESULT = "RESULT "


def make_parser(description: str, variants: Sequence[str]) -> argparse.ArgumentParser:
    """The options every variant's process shares: model size, steps, device, precision."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--tiny", action="store_true", help="tiny GPT-2, few steps: CPU smoke run")
    parser.add_argument("--seq", type=int, default=None, help="sequence length (1024; tiny: 32)")
    parser.add_argument("--batch", type=int, default=None, help="batch size (16; tiny: 4)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (30; tiny: 4)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (5; tiny 2)")
    parser.add_argument(
        "--variants", default=",".join(variants), help=f"comma-separated, of {tuple(variants)}"
    )
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    parser.add_argument(
        "--precision", default=None, choices=("amp_bf16", "fp32"), help="amp_bf16 on CUDA"
    )
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's bf16 peak")
    parser.add_argument(
        "--repeats", type=int, default=1, help="rounds over the variants (median reported)"
    )
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument(
        "--report",
        default=None,
        metavar="JSON",
        help="measure nothing: print the table and ratios of a --json file (a run cut short too)",
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser


def finish_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """The size preset filled in, the variants split; what is wrong ends in ``parser.error``."""
    preset = {"seq": 32, "batch": 4, "steps": 4, "warmup": 2} if args.tiny else {}
    preset = {"seq": 1024, "batch": 16, "steps": 30, "warmup": 5, **preset}
    for name, value in preset.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    return args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = make_parser(__doc__.splitlines()[0], VARIANTS)
    args = finish_args(parser, parser.parse_args(argv))
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {VARIANTS}")
    return args


def all_steps(args: argparse.Namespace) -> int:
    """Every step a variant runs: warm-up, timed, and any a subclass of `Clock` adds."""
    return args.warmup + args.steps + getattr(args, "trace", 0) + getattr(args, "pyprofile", 0)


# --- one variant, in its own process -------------------------------------------------------


def build(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    """(device, model, the batches' DataLoader, the autocast dtype or None)."""
    import torch
    from torch.utils.data import DataLoader
    from transformers import GPT2Config, GPT2LMHeadModel

    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    precision = args.precision or ("amp_bf16" if cuda else "fp32")
    if args.tiny:
        size = {"n_layer": 2, "n_head": 2, "n_embd": 64, "vocab_size": 256}
        size |= {"bos_token_id": 255, "eos_token_id": 255}
    else:
        size = {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50257}
    config = GPT2Config(n_positions=args.seq, **size)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    generator = torch.Generator().manual_seed(0)
    count = args.batch * all_steps(args)
    tokens = torch.randint(0, config.vocab_size, (count, args.seq), generator=generator)
    samples = [{"input_ids": row, "labels": row} for row in tokens]
    loader = DataLoader(samples, batch_size=args.batch, pin_memory=cuda)
    dtype = torch.bfloat16 if precision == "amp_bf16" else None
    return device, model, loader, dtype


def matmul_parameters(model: Any) -> int:
    position = model.transformer.wpe.weight
    return sum(p.numel() for p in model.parameters() if p is not position)


class Clock:
    """Wall time from the end of step ``warmup`` to the end of step ``warmup + steps``,
    synchronised on the device at both ends.

    Every loop calls `mark` at the points inside a step (``forward``, ``backward``,
    ``optimizer``) and `step_done` after each step; here they only count, a diagnostic's
    subclass times the points and profiles the steps after the timed ones (`extras`)."""

    def __init__(self, device: Any, args: argparse.Namespace):
        self.device, self.warmup, self.timed = device, args.warmup, args.warmup + args.steps
        self.steps, self.started, self.ended = 0, 0.0, 0.0

    def mark(self, point: str) -> None:
        """A point inside a step."""

    def now(self) -> float:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def step_done(self) -> None:
        self.steps += 1
        if self.steps == self.warmup:
            # Every variant starts its timed steps with nothing for the garbage collector to
            # catch up on: a full collection that the set-up left due (0.1-0.3 s) landed in
            # some variants' timed steps and not others', by more than the gaps measured.
            gc.collect()
            self.started = self.now()
        if self.steps == self.timed:
            self.ended = self.now()

    def stop(self) -> float:
        if not self.ended:  # fewer steps than timed: time what ran
            self.ended = self.now()
        return self.ended - self.started

    def extras(self) -> dict[str, Any]:
        """What a subclass measured besides the time, to go into the variant's result."""
        return {}


# seconds, the last timed loss, the model
Measured = tuple[float, float, Any]


def make_optimizer(model: Any, device: Any) -> Any:
    import torch

    return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")


def start_one_rank_group(device: Any) -> None:
    """A one-rank group on a store the OS gives a port (bound here, so nothing can race)."""
    import torch
    import torch.distributed as dist

    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = dist.TCPStore("127.0.0.1", 0, 1, True)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=store, rank=0, world_size=1)


def hand_written(args: argparse.Namespace, variant: str, clock: Clock) -> Measured:
    """eager, compile or fsdp: the loop a user writes by hand."""
    import contextlib

    import torch

    device, model, loader, dtype = build(args)
    model.to(device)
    if variant == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        start_one_rank_group(device)
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        for block in model.transformer.h:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
    optimizer = make_optimizer(model, device)
    forward = torch.compile(model) if variant == "compile" else model
    autocast = (
        torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
    )
    timed_loss = float("nan")
    for batch in loader:
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        clock.mark("forward")
        with autocast:
            loss = forward(**batch).loss
        clock.mark("backward")
        loss.backward()
        clock.mark("optimizer")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        clock.step_done()
        if clock.steps == clock.timed:
            timed_loss = float(loss.detach())
    return clock.stop(), timed_loss, model


def with_trainer(
    args: argparse.Namespace,
    variant: str,
    clock: Clock,
    callbacks: Sequence[Any] = (),
    **options: Any,
) -> Measured:
    """trainer, trainer_compile or trainer_fsdp; ``callbacks`` run before the clock's at each
    event, ``options`` go to the Trainer."""
    from trainkit.core import Callback
    from trainkit.trainer import HuggingFaceModel, Trainer

    device, model, loader, dtype = build(args)
    losses: list[float] = []

    class Timing(Callback):
        def before_forward(self, state: Any, logger: Any) -> None:
            clock.mark("forward")

        def before_backward(self, state: Any, logger: Any) -> None:
            clock.mark("backward")

        def after_backward(self, state: Any, logger: Any) -> None:
            clock.mark("optimizer")

        def batch_end(self, state: Any, logger: Any) -> None:
            clock.step_done()
            if clock.steps == clock.timed:
                losses.append(float(state.loss.detach()))

    if variant == "trainer_compile":
        options["compile"] = True
    if variant == "trainer_fsdp":
        from trainkit.core.dist import init_distributed
        from trainkit.parallel import FSDP

        init_distributed(backend="nccl" if device.type == "cuda" else "gloo", env={})
        options["parallelism"] = FSDP()
    trainer = Trainer(
        model=HuggingFaceModel(model),
        optimizers=make_optimizer(model, device),
        train_dataloader=loader,
        max_duration=f"{all_steps(args)}ba",
        precision="amp_bf16" if dtype is not None else "fp32",
        device=device.type,
        callbacks=[*callbacks, Timing()],
        progress_bar=False,
        seed=0,
        **options,
    )
    trainer.fit()
    return clock.stop(), losses[-1], model


def with_lightning(args: argparse.Namespace, clock: Clock) -> Measured:
    try:
        import lightning as L
    except ImportError:
        import pytorch_lightning as L

    device, model, loader, dtype = build(args)
    losses: list[float] = []

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.last = 0.0

        def training_step(self, batch: Any, index: int) -> Any:
            clock.mark("forward")
            loss = self.model(**batch).loss
            self.last = loss.detach()
            return loss

        def on_before_backward(self, loss: Any) -> None:
            clock.mark("backward")

        def on_after_backward(self) -> None:
            clock.mark("optimizer")

        def configure_optimizers(self) -> Any:
            return make_optimizer(self.model, device)

    class Timing(L.Callback):
        def on_train_batch_end(self, *unused: Any) -> None:
            clock.step_done()
            if clock.steps == clock.timed:
                losses.append(float(module.last))

    module = Module()
    trainer = L.Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=1,
        max_steps=all_steps(args),
        precision="bf16-mixed" if dtype is not None else "32-true",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Timing()],
    )
    trainer.fit(module, loader)
    return clock.stop(), losses[-1], model


def run_variant(args: argparse.Namespace, variant: str, clock: Clock) -> Measured:
    if variant == "lightning":
        return with_lightning(args, clock)
    if variant.startswith("trainer"):
        return with_trainer(args, variant, clock)
    return hand_written(args, variant, clock)


def run_worker(
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace, str, Any], Measured] = run_variant,
    clock_class: type[Clock] = Clock,
) -> dict[str, Any]:
    """``args.worker``'s variant, run in this process by ``run`` on a ``clock_class``."""
    import torch

    variant = args.worker
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if not cuda:
        torch.set_num_threads(1)  # CPU figures from a shared machine: at least no oversubscription
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    clock = clock_class(device, args)
    seconds, loss, model = run(args, variant, clock)
    result = {
        "variant": variant,
        "tokens_per_s": args.batch * args.seq * args.steps / seconds,
        "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "loss": loss,
        "params": matmul_parameters(model),
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        **clock.extras(),
    }
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return result


# --- the parent: one fresh process per variant ----------------------------------------------


def measure(script: str, variant: str, argv: list[str]) -> dict[str, Any]:
    """``variant`` run by ``script --worker`` in a fresh process; its result, or its error."""
    if variant == "lightning" and not any(
        _importable(name) for name in ("lightning", "pytorch_lightning")
    ):
        return {"variant": variant, "error": "not installed"}
    command = [sys.executable, os.path.abspath(script), *argv, "--worker", variant]
    done = subprocess.run(command, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT) :])
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"variant": variant, "error": f"exit {done.returncode}: {tail[0][:200]}"}


def worker_argv(args: argparse.Namespace) -> list[str]:
    """The options a worker process needs to build the same model, data and precision."""
    argv = ["--seq", str(args.seq), "--batch", str(args.batch), "--steps", str(args.steps)]
    argv += ["--warmup", str(args.warmup), "--device", args.device]
    if args.tiny:
        argv.append("--tiny")
    if args.precision:
        argv += ["--precision", args.precision]
    return argv


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def peak_flops(device_name: str, given_tflops: float | None) -> float | None:
    """The dense bf16 peak of ``device_name`` in FLOP/s (``given_tflops`` wins)."""
    if given_tflops is not None:
        return given_tflops * 1e12
    for key, flops in PEAK_BF16:
        if key in device_name:
            return flops
    return None


def report(args: argparse.Namespace, results: list[dict[str, Any]]) -> list[str]:
    """Print the table, the ratios and the summary line; returns the missed targets."""
    ok = {r["variant"]: r for r in results if "error" not in r}
    device = next((r["device"] for r in ok.values()), "?")
    peak = peak_flops(device, args.peak_tflops)
    rounds = f"; median of {args.repeats} rounds" if args.repeats > 1 else ""
    print(f"device {device}; seq {args.seq}, batch {args.batch}, {args.steps} timed steps{rounds}")
    width = max([16, *(len(r["variant"]) for r in results)])
    print(f"{'variant':{width}s} {'tokens/s':>11s} {'MFU':>6s} {'peak GB':>8s} {'loss':>7s}")
    for r in results:
        if "error" in r:
            print(f"{r['variant']:{width}s} skipped: {r['error']}")
            continue
        mfu = f"{6 * r['params'] * r['tokens_per_s'] / peak:6.1%}" if peak else "   n/a"
        memory = f"{r['peak_bytes'] / 1e9:8.2f}" if r["peak_bytes"] is not None else "     n/a"
        spread = r.get("rounds", [])
        spread = f"  ({spread[0]:.1f}-{spread[-1]:.1f})" if len(spread) > 1 else ""
        print(
            f"{r['variant']:{width}s} {r['tokens_per_s']:11.1f} {mfu} {memory} "
            f"{r['loss']:7.3f}{spread}"
        )
    missed, figures = [], []
    for variant, baseline in BASELINE.items():
        if variant not in ok or baseline not in ok:
            continue
        speed = ok[variant]["tokens_per_s"] / ok[baseline]["tokens_per_s"]
        line = f"{variant}/{baseline}: tokens/s {speed:.3f} (>= {SPEED_TARGET[variant]})"
        figures.append(f"{variant} {speed:.3f}")
        if speed < SPEED_TARGET[variant]:
            missed.append(f"{variant} speed {speed:.3f}")
        mine, theirs = ok[variant]["peak_bytes"], ok[baseline]["peak_bytes"]
        if mine is not None and theirs:
            memory = mine / theirs
            line += f", peak memory {memory:.4f} (<= {MEMORY_TARGET})"
            figures.append(f"{variant} memory {memory:.4f}")
            if memory > MEMORY_TARGET:
                missed.append(f"{variant} memory {memory:.4f}")
        print(line)
    if "lightning" in ok and "eager" in ok:
        speed = ok["lightning"]["tokens_per_s"] / ok["eager"]["tokens_per_s"]
        print(f"lightning/eager: tokens/s {speed:.3f} (for reference)")
    verdict = "all targets met" if not missed else "missed: " + ", ".join(missed)
    if device == "cpu":
        verdict += " (CPU: a smoke run, not the GPU targets)"
    print(f"summary: {'; '.join(figures) or 'no pairs measured'}; {verdict}")
    return missed


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One variant's rounds as one result: the median tokens/s, the largest peak memory."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[-1]
    speeds = sorted(r["tokens_per_s"] for r in ok)
    peaks = [r["peak_bytes"] for r in ok if r["peak_bytes"] is not None]
    result = {**ok[0], "tokens_per_s": statistics.median(speeds), "rounds": speeds}
    result["peak_bytes"] = max(peaks) if peaks else None
    return result


def report_file(path: str, show: Callable[[argparse.Namespace, list[dict[str, Any]]], Any]) -> int:
    """The table of a --json file, from the variants it holds: a run stopped before its
    end (a device call's time limit) still gives the ratios of the pairs it finished."""
    with open(path) as file:
        saved = json.load(file)
    runs = {variant: rounds for variant, rounds in saved["runs"].items() if rounds}
    if not runs:
        print(f"{path}: no variant finished")
        return 1
    args = argparse.Namespace(**saved["args"])
    args.repeats = max(len(rounds) for rounds in runs.values())
    missing = [variant for variant in args.variants if variant not in runs]
    if missing:
        print(f"{path}: not measured: {', '.join(missing)}")
    show(args, [combine(rounds) for rounds in runs.values()])
    return 0


def run_rounds(
    args: argparse.Namespace,
    script: str,
    argv: list[str],
    show: Callable[[argparse.Namespace, list[dict[str, Any]]], Any],
) -> int:
    """Each variant in a fresh process of ``script``, ``args.repeats`` interleaved rounds (a
    slow spell of a shared machine then falls on all), written to ``--json`` as they end;
    then ``show`` the combined results."""
    runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in args.variants}
    for round_ in range(args.repeats):
        for variant in args.variants:
            started = time.perf_counter()
            result = measure(script, variant, argv)
            runs[variant].append(result)
            took = time.perf_counter() - started
            if "error" in result:
                done = result["error"]
            else:
                peak = result["peak_bytes"]
                memory = f", peak {peak / 1e9:.2f} GB" if peak is not None else ""
                done = f"{result['tokens_per_s']:.1f} tokens/s{memory}, loss {result['loss']:.3f}"
            print(f"  round {round_ + 1} {variant}: {done} ({took:.0f} s)", flush=True)
            if args.json:  # after every variant: a run cut short keeps what it measured
                with open(args.json, "w") as file:
                    json.dump({"args": vars(args), "runs": runs}, file, indent=1)
    results = [combine(runs[variant]) for variant in args.variants]
    show(args, results)
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"args": vars(args), "results": results, "runs": runs}, file, indent=1)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        print(RESULT + json.dumps(run_worker(args)), flush=True)
        return 0
    if args.report:
        return report_file(args.report, report)
    return run_rounds(args, __file__, worker_argv(args), report)


if __name__ == "__main__":
    sys.exit(main())
