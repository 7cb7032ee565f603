"""Where a gap between the Trainer and a hand-written loop comes from: the variants of
``bench/gpu_throughput.py`` and steps between them, with profiles, per-phase times and
one change at a time. Its figures explain a gap; the parity figures are gpu_throughput's.

Besides gpu_throughput's variants, two steps from fsdp towards trainer_fsdp:

    fsdp_mesh        fsdp's loop, sharded with the options trainkit's FSDP() passes (its
                     sub-mesh of the 3-D data/tensor mesh, an explicit OffloadPolicy)
    fsdp_wrapped     fsdp_mesh with HuggingFaceModel as the root module, called as the
                     Trainer calls it: model(batch), then model.loss(outputs, batch)

A variant may carry changes, each ``+NAME`` or ``+NAME=N``, that move it one piece towards
the other side; ``fsdp_wrapped+zero_first`` is fsdp_wrapped with its ``zero_grad`` where the
Trainer calls it. Each changed variant is reported against its unchanged one:

    zero_first            hand-written: zero_grad before the forward, where the Trainer calls it
    loss_watch            hand-written: the Trainer's non-finite loss check after each step
    trainer_data          hand-written: batches read as the Trainer reads them (DataSpec's
                          resumable loader, counted, moved by its device_transfer)
    split_autocast        fsdp_wrapped: the loss in an autocast region of its own, as the Trainer
    reverse_blocks        hand-written FSDP2: blocks sharded last to first, as FSDP() orders them
    broadcast             hand-written FSDP2: every parameter and buffer broadcast from rank 0
                          before sharding, as FSDP(sync_module_states=True) did on one rank
    no_loss_watch         Trainer: without its non-finite loss check
    zero_after_step       Trainer: zero_grad after the optimizer step instead of before forward
    no_gc_freeze          Trainer(gc_freeze=False)
    host_between=US       any but lightning: the host busy US microseconds between steps
    host_forward=US       any but lightning: the host busy US microseconds between the loss and
                          the backward (with host_between: how much host time there costs)

    uv run python bench/throughput_diagnostics.py --trace 5 --variants fsdp,trainer_fsdp
    uv run python bench/throughput_diagnostics.py --variants fsdp,fsdp_mesh,fsdp_wrapped,trainer_fsdp
    uv run python bench/throughput_diagnostics.py --variants fsdp_wrapped,fsdp_wrapped+host_between=1000
    uv run python bench/throughput_diagnostics.py --pyprofile 5 --variants fsdp_wrapped,trainer_fsdp
    uv run python bench/throughput_diagnostics.py --report results.json

``--trace N`` profiles N more steps of each variant after its timed steps (torch.profiler;
the timed figures are not affected) and prints where a step's time goes: wall time,
device busy time, kernels and host-device synchronisations per step, and, for each pair
(trainer_fsdp against fsdp, ...), the kernels whose time per step differs most, the aten
operators whose count per step differs, and the operators and CUDA runtime calls whose own
host time per step differs. A gap between a pair then shows as more device
work (different kernels) or as an idle device: the idle time per step and the largest idle
gaps, each named by the kernel that ended it (a host that waited, or fell behind, there).

``--pyprofile N`` runs N more steps (after --trace's) under cProfile and lists, per pair, the
functions whose own host time per step differs most: the Python a Trainer runs that a
hand-written loop does not, by function, on the machine where the gap is (the main
thread only: autograd's backward threads are not followed).

``--phases`` splits each timed step in four, from CUDA events recorded on the current stream
at the step's points (and the host's clock at the same points): before the forward (data,
the Trainer's zero_grad and own work), forward and loss, backward, and the optimizer step
(the hand-written loops' zero_grad too); with the time the garbage collector took. Device
time per phase that differs between a pair, with the same kernels, is idle time in that
phase. Its 4 events per timed step cost microseconds, but the objects they make move when
the garbage collector runs: compare runs with ``--phases`` with each other.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any


def _load_parity() -> Any:
    """bench/gpu_throughput.py, this script's sibling, whether run as a script or loaded by
    path (the tests do)."""
    if "gpu_throughput" in sys.modules:
        return sys.modules["gpu_throughput"]
    path = Path(__file__).with_name("gpu_throughput.py")
    spec = importlib.util.spec_from_file_location("gpu_throughput", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["gpu_throughput"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


parity = _load_parity()

DIAGNOSTIC = ("fsdp_mesh", "fsdp_wrapped")
ALL_VARIANTS = (*parity.VARIANTS, *DIAGNOSTIC)
# fsdp -> trainer_fsdp one change at a time: each step's ratio names the change that costs.
STEPS = (("fsdp_mesh", "fsdp"), ("fsdp_wrapped", "fsdp_mesh"), ("trainer_fsdp", "fsdp_wrapped"))
HAND_WRITTEN = ("eager", "compile", "fsdp", *DIAGNOSTIC)
TRAINERS = ("trainer", "trainer_compile", "trainer_fsdp")
# A change to a variant: the variants it applies to, and whether it takes a number (+NAME=N).
CHANGES: dict[str, tuple[tuple[str, ...], bool]] = {
    "zero_first": (HAND_WRITTEN, False),
    "loss_watch": (HAND_WRITTEN, False),
    "trainer_data": (HAND_WRITTEN, False),
    "split_autocast": (("fsdp_wrapped",), False),
    "reverse_blocks": (("fsdp", *DIAGNOSTIC), False),
    "broadcast": (("fsdp", *DIAGNOSTIC), False),
    "no_loss_watch": (TRAINERS, False),
    "zero_after_step": (TRAINERS, False),
    "no_gc_freeze": (TRAINERS, False),
    "host_between": ((*HAND_WRITTEN, *TRAINERS), True),
    "host_forward": ((*HAND_WRITTEN, *TRAINERS), True),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = parity.make_parser(__doc__.splitlines()[0], parity.VARIANTS)
    parser.add_argument(
        "--trace",
        type=int,
        default=0,
        metavar="N",
        help="profile N more steps after the timed ones and compare where the time goes",
    )
    parser.add_argument(
        "--pyprofile",
        type=int,
        default=0,
        metavar="N",
        help="N more steps (after --trace's) under cProfile: the host's Python per function",
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help="time each timed step's phases (CUDA events) and the garbage collector",
    )
    args = parity.finish_args(parser, parser.parse_args(argv))
    unknown = sorted({split_variant(v)[0] for v in args.variants} - set(ALL_VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {ALL_VARIANTS}")
    for variant in args.variants:
        problem = check_changes(variant)
        if problem:
            parser.error(problem)
    for name in ("trace", "pyprofile"):
        if getattr(args, name) < 0:
            parser.error(f"--{name} must be 0 (no profile) or a number of steps")
    return args


def split_variant(variant: str) -> tuple[str, dict[str, str]]:
    """``"fsdp_wrapped+zero_first+host_between=500"`` -> ``("fsdp_wrapped", {"zero_first":
    "", "host_between": "500"})``."""
    base, *changes = variant.split("+")
    return base, dict(change.partition("=")[::2] for change in changes)


def check_changes(variant: str) -> str | None:
    """What is wrong with ``variant``'s changes (`CHANGES`), or None."""
    base, changes = split_variant(variant)
    for name, value in changes.items():
        if name not in CHANGES:
            return f"{variant}: unknown change {name!r}; choose from {sorted(CHANGES)}"
        applies, numeric = CHANGES[name]
        if base not in applies:
            return f"{variant}: {name} applies to {', '.join(applies)}, not {base}"
        if numeric and not value.isdigit():
            return f"{variant}: {name} needs a number of microseconds, as {name}=500"
        if not numeric and value:
            return f"{variant}: {name} takes no value, got {name}={value}"
    return None


def keep_host_busy(microseconds: str | None) -> None:
    """Keep the host busy (holding the GIL, as Python work does) for that long."""
    if microseconds:
        end = time.perf_counter() + int(microseconds) / 1e6
        while time.perf_counter() < end:
            pass


# --- the clock and its profiles -----------------------------------------------------------


class DiagnosticClock(parity.Clock):
    """gpu_throughput's clock, and: with ``--phases`` each timed step cut at its points
    (`Phases`); with ``--trace`` a profile of that many steps after the timed ones
    (`Trace`); with ``--pyprofile`` cProfile over that many more (`PythonProfile`)."""

    def __init__(self, device: Any, args: argparse.Namespace):
        super().__init__(device, args)
        self.trace = Trace(device, args.trace) if args.trace else None
        self.python = PythonProfile(args.pyprofile) if args.pyprofile else None
        self.phases = Phases(device) if args.phases else None

    def mark(self, point: str) -> None:
        if self.phases is not None:
            self.phases.mark(point)  # timed steps only: the phases are on between them

    def step_done(self) -> None:
        if self.phases is not None:
            self.phases.mark("done")
        super().step_done()
        if self.steps == self.warmup and self.phases is not None:
            self.phases.start()
        if self.steps == self.timed:
            if self.phases is not None:
                self.phases.stop()
            if self.trace is not None:
                self.trace.start()
        elif self.trace is not None and self.steps == self.timed + self.trace.steps:
            self.trace.stop()
        traced = self.timed + (self.trace.steps if self.trace is not None else 0)
        if self.python is not None:  # after the traced steps: one profiler at a time
            if self.steps == traced:
                self.python.start()
            elif self.steps == traced + self.python.steps:
                self.python.stop()

    def extras(self) -> dict[str, Any]:
        found = {
            "profile": self.trace.summary if self.trace is not None else None,
            "phases": self.phases.summary() if self.phases is not None else None,
            "python": self.python.summary if self.python is not None else None,
        }
        return {name: value for name, value in found.items() if value is not None}


class Phases:
    """The timed steps cut at `POINTS`: each point's CUDA event (on the current stream) and
    host time, and the garbage collector's pauses between `start` and `stop`."""

    POINTS = ("forward", "backward", "optimizer", "done")
    NAMES = {  # the phase that ends at each point
        "forward": "before forward",
        "backward": "forward+loss",
        "optimizer": "backward",
        "done": "optimizer",
    }

    def __init__(self, device: Any):
        self.cuda = device.type == "cuda"
        self.points: list[tuple[str, float, Any]] = []
        self.gc_seconds, self.collections, self._gc_began = 0.0, 0, None
        self._on = False

    def start(self) -> None:
        self._on = True
        self.mark("done")  # the end of the last untimed step
        gc.callbacks.append(self._gc)

    def stop(self) -> None:
        self._on = False
        gc.callbacks.remove(self._gc)

    def mark(self, point: str) -> None:
        import torch

        if not self._on:
            return
        event = None
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        self.points.append((point, time.perf_counter(), event))

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_began = time.perf_counter()
        elif self._gc_began is not None:
            self.gc_seconds += time.perf_counter() - self._gc_began
            self.collections += 1
            self._gc_began = None

    def summary(self) -> dict[str, Any]:
        """Per timed step, in ms: each phase's device time (CUDA) and host time."""
        import torch

        if self.cuda:
            torch.cuda.synchronize()
        steps = sum(point == "done" for point, _, _ in self.points[1:])
        device = dict.fromkeys(self.NAMES.values(), 0.0)
        host = dict.fromkeys(self.NAMES.values(), 0.0)
        for (_, host_a, event_a), (point, host_b, event_b) in zip(
            self.points, self.points[1:], strict=False
        ):
            name = self.NAMES[point]
            host[name] += 1e3 * (host_b - host_a)
            if event_a is not None:
                device[name] += event_a.elapsed_time(event_b)
        per_step = max(steps, 1)
        return {
            "steps": steps,
            "device_ms": {k: v / per_step for k, v in device.items()} if self.cuda else None,
            "host_ms": {k: v / per_step for k, v in host.items()},
            "gc_ms": 1e3 * self.gc_seconds / per_step,
            "gc_collections": self.collections / per_step,
        }


class PythonProfile:
    """``steps`` steps under cProfile, per step: each function's own time and calls.

    The main thread's Python and the C functions it calls (a tensor operator's call counts
    whole, as do waits inside it); what autograd's device threads run in backward (FSDP's
    post-backward hooks, say) is not seen, as cProfile follows one thread.
    """

    KEEP = 1000  # functions kept, by own time (a GPT-2 step under FSDP() calls ~530)

    def __init__(self, steps: int):
        self.steps = steps
        self.profiler: Any = None
        self.summary: dict[str, Any] | None = None

    def start(self) -> None:
        import cProfile

        self.profiler = cProfile.Profile()
        self.profiler.enable()

    def stop(self) -> None:
        import pstats

        self.profiler.disable()
        stats = pstats.Stats(self.profiler).stats  # type: ignore[attr-defined]
        own_ms, calls = {}, {}
        for (file, line, name), (_, count, own, _, _) in stats.items():
            key = function_name(file, line, name)
            own_ms[key] = own_ms.get(key, 0.0) + 1e3 * own / self.steps
            calls[key] = calls.get(key, 0.0) + count / self.steps
        kept = sorted(own_ms, key=lambda key: -own_ms[key])[: self.KEEP]
        self.summary = {
            "own_ms_total": sum(own_ms.values()),
            "calls_total": sum(calls.values()),
            "own_ms": {key: own_ms[key] for key in kept},
            "calls": {key: calls[key] for key in kept},
        }


def function_name(file: str, line: int, name: str) -> str:
    """``torch/optim/adam.py:348(_single_tensor_adam)``: the path from the package on."""
    if file == "~":  # a C function
        return name
    for marker in ("site-packages/", "dist-packages/", "/src/", "/bench/"):
        if marker in file:
            file = file.rsplit(marker, 1)[1]
            break
    return f"{file}:{line}({name})"


class Trace:
    """``steps`` steps under torch.profiler, summed up per step: wall time, device busy time
    (kernels and copies), kernel launches, blocking synchronisations, the kernels' time."""

    def __init__(self, device: Any, steps: int):
        self.device, self.steps = device, steps
        self.profiler: Any = None
        self.summary: dict[str, Any] | None = None
        self._started = 0.0

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self.profiler = profile(activities=activities)
        self.profiler.__enter__()
        self._started = time.perf_counter()

    def stop(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        wall = time.perf_counter() - self._started
        self.profiler.__exit__(None, None, None)
        self.summary = summarise(self.profiler.key_averages(), wall, self.steps)
        device_work = [
            (event.time_range.start, event.time_range.end, event.name)
            for event in self.profiler.events()
            if on_device(event)
        ]
        idle_us, gaps = idle_gaps(device_work)
        self.summary["idle_ms"] = idle_us / 1e3 / self.steps
        self.summary["largest_gaps"] = [(us / 1e3, after) for us, after in gaps]


def idle_gaps(
    work: list[tuple[float, float, str]], largest: int = 5
) -> tuple[float, list[tuple[float, str]]]:
    """The time the device sat idle between the first and the last of ``work`` (start, end,
    name: kernels and copies on any stream, in µs), and the ``largest`` idle gaps, each with
    the work that ended it: a gap before the first kernel of a step is a host that waited
    (a sync) or fell behind there."""
    idle, gaps, busy_until = 0.0, [], None
    for start, end, name in sorted(work):
        if busy_until is not None and start > busy_until:
            idle += start - busy_until
            gaps.append((start - busy_until, name))
        busy_until = end if busy_until is None else max(busy_until, end)
    gaps.sort(key=lambda gap: -gap[0])
    return idle, gaps[:largest]


def on_device(event: Any) -> bool:
    """Whether a profiler event is work the device did: a kernel, copy or memset. The
    profiler also puts each ``record_function`` range that encloses device work on the
    device's timeline (FSDP's ``FSDP::pre_forward``, ``Optimizer.step#AdamW.step``), over
    the kernels and the idle time between them: counted, those would be busy time twice
    and hide idle gaps."""
    from torch.autograd import DeviceType

    return event.device_type == DeviceType.CUDA and not getattr(event, "is_user_annotation", False)


def summarise(averages: Any, wall: float, steps: int) -> dict[str, Any]:
    """Per-step figures from a profile's ``key_averages()`` (times in ms)."""
    from torch.autograd import DeviceType

    device_ms, launches, syncs, ops = 0.0, 0, 0, 0
    kernels: dict[str, float] = {}
    op_counts: dict[str, float] = {}
    host: dict[str, float] = {}  # host time in each operator or runtime call, its own part
    for event in averages:
        # FSDP's ranges name their module: under HuggingFaceModel it is one level down
        # ("model.transformer.h.0"), the same module as "transformer.h.0" of the bare model.
        key = event.key.replace("(model.", "(")
        if event.device_type == DeviceType.CUDA:
            if not on_device(event):
                continue  # a range mirrored onto the device's timeline: no work of its own
            own = event.self_device_time_total / 1e3
            device_ms += own
            kernels[key] = kernels.get(key, 0.0) + own / steps
            continue
        host[key] = host.get(key, 0.0) + event.self_cpu_time_total / 1e3 / steps
        if key.startswith(("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperative")):
            launches += event.count
        elif key.startswith("cuda") and ("Synchronize" in key or key == "cudaMemcpy"):
            syncs += event.count  # the host waits for the device
        elif key.startswith("aten::"):
            ops += event.count
            op_counts[key] = event.count / steps
    top = sorted(kernels.items(), key=lambda item: -item[1])[:40]
    host_top = sorted(host.items(), key=lambda item: -item[1])[:60]
    return {
        "wall_ms": 1e3 * wall / steps,
        "device_ms": device_ms / steps,
        "launches": launches / steps,
        "syncs": syncs / steps,
        "aten_ops": ops / steps,
        "kernels_ms": dict(top),
        "aten_counts": op_counts,
        "host_ms": dict(host_top),
    }


# --- the variants and their changes -------------------------------------------------------


def trainkit_fsdp_options(device: Any) -> dict[str, Any]:
    """What `trainkit.parallel.FSDP().prepare` passes ``fully_shard`` on one rank besides the
    same mixed precision and reshard choices: the "shard" dim of its 3-D mesh, and an
    ``OffloadPolicy``."""
    from torch.distributed.fsdp import OffloadPolicy

    from trainkit.parallel import FSDP

    mesh = FSDP().dims(1).build_mesh(device.type, 1)
    return {"mesh": mesh["shard"], "offload_policy": OffloadPolicy()}


def hand_written(args: argparse.Namespace, variant: str, clock: parity.Clock) -> parity.Measured:
    """A hand-written variant with its changes (each a step towards the Trainer)."""
    import contextlib

    import torch

    variant, changes = split_variant(variant)
    device, model, loader, dtype = parity.build(args)
    model.to(device)
    root = model
    if variant == "fsdp_wrapped":
        from trainkit.trainer import HuggingFaceModel

        root = HuggingFaceModel(model)
    if variant.startswith("fsdp"):
        import torch.distributed as dist
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        parity.start_one_rank_group(device)
        if "broadcast" in changes:
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor.data, src=0)
        options: dict[str, Any] = {
            "mp_policy": MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        }
        blocks, root_only = {}, {}
        if variant != "fsdp":  # the root kept gathered after forward, as FSDP() asks
            options.update(trainkit_fsdp_options(device))
            blocks, root_only = {"reshard_after_forward": True}, {"reshard_after_forward": None}
        order = list(model.transformer.h)
        for block in reversed(order) if "reverse_blocks" in changes else order:
            fully_shard(block, **options, **blocks)
        fully_shard(root, **options, **root_only)
    optimizer = parity.make_optimizer(model, device)
    forward = torch.compile(model) if variant == "compile" else model
    autocast = (
        torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
    )

    def step_loss(batch: dict[str, Any]) -> Any:
        if variant != "fsdp_wrapped":
            with autocast:
                return forward(**batch).loss
        # As the Trainer calls a HuggingFaceModel: model(batch), then model.loss.
        with autocast:
            outputs = root(batch)
            if "split_autocast" not in changes:
                return root.loss(outputs, batch)
        with autocast:
            return root.loss(outputs, batch)

    batches: Any = loader
    data = None
    if "trainer_data" in changes:
        from trainkit.core import DataSpec

        data = DataSpec(loader)
        data.make_resumable(0)
        batches = data.iter_epoch(0)
    watch = None
    if "loss_watch" in changes:
        from trainkit.trainer._nonfinite import LossWatch

        watch = LossWatch()
    loss, timed_loss = None, float("nan")
    for batch in batches:
        if data is not None:
            data.count_batch(batch, 1, device)
            batch = data.device_transfer(batch, device)
        else:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        if "zero_first" in changes:
            optimizer.zero_grad(set_to_none=True)
        clock.mark("forward")
        loss = step_loss(batch)
        keep_host_busy(changes.get("host_forward"))
        clock.mark("backward")
        loss.backward()
        clock.mark("optimizer")
        optimizer.step()
        if "zero_first" not in changes:
            optimizer.zero_grad(set_to_none=True)
        clock.step_done()
        if watch is not None:
            watch.update(loss, clock.steps)
        keep_host_busy(changes.get("host_between"))
        if clock.steps == clock.timed:
            timed_loss = float(loss.detach())
    return clock.stop(), timed_loss, model


def with_trainer(args: argparse.Namespace, variant: str, clock: parity.Clock) -> parity.Measured:
    """gpu_throughput's Trainer variant with its changes: callbacks that run before the
    clock's, the Trainer's own calls patched in this (fresh) process, or an option."""
    import torch

    from trainkit.core import Callback

    variant, changes = split_variant(variant)
    zero_grad = torch.optim.Optimizer.zero_grad
    if "zero_after_step" in changes:  # this process only: the Trainer's call does nothing
        torch.optim.Optimizer.zero_grad = lambda self, set_to_none=True: None  # type: ignore[method-assign,assignment]
    if "no_loss_watch" in changes:
        from trainkit.trainer._nonfinite import LossWatch

        LossWatch.update = lambda self, loss, batch: None  # type: ignore[method-assign,assignment]

    class Changes(Callback):
        def before_forward(self, state: Any, logger: Any) -> None:
            keep_host_busy(changes.get("host_between"))  # the last step's end to this forward

        def before_backward(self, state: Any, logger: Any) -> None:
            keep_host_busy(changes.get("host_forward"))

        def batch_end(self, state: Any, logger: Any) -> None:
            if "zero_after_step" in changes:
                for optimizer in state.optimizers:
                    zero_grad(optimizer, set_to_none=True)

    options: dict[str, Any] = {}
    if "no_gc_freeze" in changes:
        options["gc_freeze"] = False
    return parity.with_trainer(args, variant, clock, [Changes()], **options)


def run_variant(args: argparse.Namespace, variant: str, clock: parity.Clock) -> parity.Measured:
    base = split_variant(variant)[0]
    if base == "lightning":
        return parity.with_lightning(args, clock)
    if base in TRAINERS:
        return with_trainer(args, variant, clock)
    return hand_written(args, variant, clock)


def worker_argv(args: argparse.Namespace) -> list[str]:
    argv = parity.worker_argv(args)
    if args.trace:
        argv += ["--trace", str(args.trace)]
    if args.pyprofile:
        argv += ["--pyprofile", str(args.pyprofile)]
    if args.phases:
        argv.append("--phases")
    return argv


def report(args: argparse.Namespace, results: list[dict[str, Any]]) -> list[str]:
    """gpu_throughput's table and ratios, then the steps between the pairs, the changed
    variants against their own, and the profiles, phases and Python of each pair."""
    missed = parity.report(args, results)
    ok = {r["variant"]: r for r in results if "error" not in r}
    steps = [(v, b) for v, b in STEPS if v in ok and b in ok]
    if steps:
        print(f"fsdp -> trainer_fsdp, one change at a time: {speed_ratios(ok, steps)}")
    changed = changed_pairs(ok)
    if changed:
        print(f"changed variants against their own: {speed_ratios(ok, changed)}")
    report_profiles(ok)
    report_phases(ok)
    report_python(ok)
    return missed


def speed_ratios(ok: dict[str, dict[str, Any]], pairs: list[tuple[str, str]]) -> str:
    """``"a/b 0.990, c/d 1.002"``: each pair's tokens/s ratio."""
    return ", ".join(
        f"{v}/{b} {ok[v]['tokens_per_s'] / ok[b]['tokens_per_s']:.3f}" for v, b in pairs
    )


# --- the report ---------------------------------------------------------------------------


def report_profiles(ok: dict[str, dict[str, Any]], kernels: int = 8, ops: int = 16) -> None:
    """The --trace figures per step, then for each pair the kernels whose time differs most
    and the aten operators whose count per step differs (on CPU too: the host-side work)."""
    profiled = {variant: r["profile"] for variant, r in ok.items() if "profile" in r}
    if not profiled:
        return
    print(f"per traced step (first round): {'wall ms':>8s} {'device ms':>9s} {'busy':>6s} "
          f"{'idle ms':>7s} {'launches':>8s} {'syncs':>6s} {'aten ops':>8s}")  # fmt: skip
    for variant, p in profiled.items():
        busy = f"{p['device_ms'] / p['wall_ms']:6.1%}" if p["device_ms"] else "   n/a"
        idle = f"{p['idle_ms']:7.2f}" if p["device_ms"] and "idle_ms" in p else "    n/a"
        print(
            f"  {variant:28s} {p['wall_ms']:8.2f} {p['device_ms']:9.2f} {busy} {idle} "
            f"{p['launches']:8.0f} {p['syncs']:6.1f} {p['aten_ops']:8.0f}"
        )
    for variant, p in profiled.items():
        if p.get("largest_gaps"):
            gaps = ", ".join(f"{ms:.2f} ms before {name[:60]}" for ms, name in p["largest_gaps"])
            print(f"  {variant}: largest idle gaps (all traced steps): {gaps}")
    for variant, baseline in pairs(profiled):
        kernel_ms = largest_differences(
            profiled[variant]["kernels_ms"], profiled[baseline]["kernels_ms"], kernels, 0.0
        )
        if kernel_ms:
            print(f"  {variant} - {baseline}, device ms per step, largest differences:")
            for difference, name in kernel_ms:
                print(f"    {difference:+8.3f}  {name[:100]}")
        op_counts = largest_differences(  # files from before --trace counted operators lack them
            profiled[variant].get("aten_counts", {}),
            profiled[baseline].get("aten_counts", {}),
            ops,
            0.5,
        )
        if op_counts:
            print(f"  {variant} - {baseline}, aten ops per step, largest differences:")
            for difference, name in op_counts:
                print(f"    {difference:+8.1f}  {name}")
        host_ms = largest_differences(  # where a host that falls behind spends its time
            profiled[variant].get("host_ms", {}), profiled[baseline].get("host_ms", {}), ops, 0.0
        )
        if host_ms:
            print(f"  {variant} - {baseline}, host ms per step (own time), largest differences:")
            for difference, name in host_ms:
                print(f"    {difference:+8.3f}  {name[:100]}")


def report_phases(ok: dict[str, dict[str, Any]]) -> None:
    """The --phases figures: per timed step, each phase's device and host ms, and the
    garbage collector's; then each pair's device-time difference per phase."""
    timed = {variant: r["phases"] for variant, r in ok.items() if "phases" in r}
    if not timed:
        return
    names = list(Phases.NAMES.values())
    print("per timed step (first round), ms: " + ", ".join(names) + "; device / host")
    for variant, p in timed.items():
        device, host = p["device_ms"], p["host_ms"]
        cells = [
            (f"{device[n]:.2f}/" if device is not None else "") + f"{host[n]:.2f}" for n in names
        ]
        print(
            f"  {variant:16s} " + "  ".join(f"{c:>13s}" for c in cells)
            + f"  gc {p['gc_ms']:.2f} ms, {p['gc_collections']:.2f} collections"
        )  # fmt: skip
    for variant, baseline in pairs(timed):
        mine, theirs = timed[variant], timed[baseline]
        kind = "device_ms" if mine["device_ms"] and theirs["device_ms"] else "host_ms"
        differences = ", ".join(
            f"{name} {mine[kind][name] - theirs[kind][name]:+.2f}" for name in names
        )
        print(f"  {variant} - {baseline}, {kind.split('_')[0]} ms per step: {differences}")


def report_python(ok: dict[str, dict[str, Any]], functions: int = 16) -> None:
    """The --pyprofile figures: the host's Python per step, then for each pair the functions
    whose own time per step differs most (with their calls per step)."""
    profiled = {variant: r["python"] for variant, r in ok.items() if "python" in r}
    if not profiled:
        return
    print("host Python per profiled step (first round, cProfile, main thread): own ms, calls")
    for variant, p in profiled.items():
        print(f"  {variant:28s} {p['own_ms_total']:9.2f} {p['calls_total']:9.0f}")
    for variant, baseline in pairs(profiled):
        mine, theirs = profiled[variant], profiled[baseline]
        own = largest_differences(mine["own_ms"], theirs["own_ms"], functions, 0.0)
        if own:
            print(f"  {variant} - {baseline}, own ms per step by function, largest differences:")
            for difference, name in own:
                calls = mine["calls"].get(name, 0.0) - theirs["calls"].get(name, 0.0)
                print(f"    {difference:+8.3f}  {calls:+7.1f} calls  {name[:100]}")


def pairs(measured: dict[str, Any]) -> list[tuple[str, str]]:
    """(variant, baseline) of `BASELINE`, `STEPS` and `changed_pairs` with both in
    ``measured``, once each."""
    both = [*parity.BASELINE.items(), *STEPS, *changed_pairs(measured)]
    return [
        pair for i, pair in enumerate(both) if pair not in both[:i] and set(pair) <= set(measured)
    ]


def changed_pairs(measured: dict[str, Any]) -> list[tuple[str, str]]:
    """(changed variant, the same without changes) for each changed variant in ``measured``
    whose unchanged one is there too."""
    found = []
    for variant in measured:
        base = split_variant(variant)[0]
        if base != variant and base in measured:
            found.append((variant, base))
    return found


def largest_differences(
    mine: dict[str, float], theirs: dict[str, float], limit: int, at_least: float
) -> list[tuple[float, str]]:
    """``mine - theirs`` per key (a missing key counts 0), the ``limit`` largest in size that
    exceed ``at_least``; ties in name order."""
    differences = sorted(
        ((mine.get(k, 0.0) - theirs.get(k, 0.0), k) for k in set(mine) | set(theirs)),
        key=lambda item: (-abs(item[0]), item[1]),
    )
    return [(d, k) for d, k in differences if abs(d) > at_least][:limit]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        result = parity.run_worker(args, run_variant, DiagnosticClock)
        print(parity.RESULT + json.dumps(result), flush=True)
        return 0
    if args.report:
        return parity.report_file(args.report, report)
    return parity.run_rounds(args, __file__, worker_argv(args), report)


if __name__ == "__main__":
    sys.exit(main())
