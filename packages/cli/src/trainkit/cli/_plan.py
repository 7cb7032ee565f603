"""What the embedded default run trains, chosen from the hardware it finds.

`preset` picks the model size, sequence length, batch, precision and compile for the
device, and `share_cores` the CPU threads from the cores other work leaves idle (`choose_plan`
does both); every preset trains for a fixed wall-clock budget: ``max_duration`` is a
number of seconds of training (the Trainer's wall-clock duration), and the learning rate
follows `WarmupCosine`, which warms up over a number of batches and then decays on the
fraction of that budget, so the decay ends when the time does however fast the machine is.
`default_config` turns a plan into the run's config (what ``--print-config`` shows).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from trainkit.cli._recipe import GROUP as RECIPES
from trainkit.cli._recipe import recipe_sections
from trainkit.core import plugins
from trainkit.core.config import Configurable

if TYPE_CHECKING:
    from trainkit.core import State

__all__ = [
    "Plan",
    "WarmupCosine",
    "WarmupCosineConfig",
    "busy_cores",
    "choose_plan",
    "default_config",
    "preset",
    "share_cores",
]

TOTAL_BUDGET_S = 300
DEFAULT_RECIPE = "lm_fast"
"""The recipe the embedded default trains with (measured: docs/recipes.md)."""
PROMPT = "def "  # the sample continues it for the rest of the model's context
"""The whole run, start to exit, should fit in this (the printed budget is its training part)."""


@dataclass(frozen=True)
class Plan:
    """The default run's choices."""

    device: str
    """``"cpu"`` or ``"cuda"``."""
    threads: int
    """CPU threads for torch (``torch.set_num_threads``)."""
    n_layer: int
    n_head: int
    n_embd: int
    seq_len: int
    """Bytes per training window (also the model's context)."""
    batch_size: int
    lr: float
    """Peak AdamW learning rate (high: tiny models train fast at high rates)."""
    precision: str
    compile: bool
    budget_s: int
    """Seconds of training (``max_duration``); start-up, evaluation and the sample come on
    top, within `TOTAL_BUDGET_S`."""
    warmup_batches: int
    site_packages: bool = False
    """Train on the installed packages' source too (more text for a fast device)."""
    max_bytes: int | None = None
    """At most this much training text (None: all found)."""
    notes: list[str] = field(default_factory=list)

    def describe(self, max_duration: str | None = None) -> str:
        """One line for the start of the run (``max_duration``: when overridden)."""
        params = _parameters(self.n_layer, self.n_embd, self.seq_len)
        budget = (
            f"budget {self.budget_s} s of training (~{TOTAL_BUDGET_S // 60} min in all)"
            if max_duration in (None, f"{self.budget_s}sec")
            else f"max_duration {max_duration} (instead of {self.budget_s} s)"
        )
        plural = "s" if self.threads != 1 else ""
        threads = f" ({self.threads} thread{plural})" if self.device == "cpu" else ""
        data = "stdlib + site-packages" if self.site_packages else "stdlib"
        return (
            f"default run on {self.device}{threads}: byte-level GPT-2 {self.n_layer}x"
            f"{self.n_embd} ({params / 1e6:.2f}M parameters), precision {self.precision}, "
            f"compile {'on' if self.compile else 'off'}, {budget}, batch {self.batch_size} x seq "
            f"{self.seq_len}, lr {self.lr:g}, data {data}"
        )


# Measured on 2 idle CPU cores (see the README), 2 threads, held-out bits/byte: lr 2e-3
# 2.00 (1436 batches), lr 3e-3 2.11 (1518 batches); gzip -9 2.20, xz -9 2.02 on the same
# bytes. With 1 thread (what the old load-average rule chose after any recent job) lr 2e-3
# gave 2.25 in ~900 batches.
CPU = Plan(
    device="cpu",
    threads=2,
    n_layer=2,
    n_head=4,
    n_embd=128,
    seq_len=128,
    batch_size=32,
    lr=2e-3,
    precision="fp32",  # bf16 autocast on CPU without AMX is slower here, not faster
    compile=False,  # inductor's compile takes a large part of a 4-minute CPU budget
    budget_s=230,
    warmup_batches=30,
)
# Chosen by reasoning (no GPU to measure on): an H100 trains ~100x the CPU's bytes per
# second on this wider, deeper model in bf16 with torch.compile (which takes ~30-60 s of
# the budget once), on the installed packages' source too so that ~4 minutes do not
# revisit the same bytes many times.
GPU = Plan(
    device="cuda",
    threads=1,
    n_layer=6,
    n_head=6,
    n_embd=384,
    seq_len=512,
    batch_size=64,
    lr=2e-3,
    precision="amp_bf16",
    compile=True,
    budget_s=240,
    warmup_batches=100,
    site_packages=True,
    max_bytes=200_000_000,
)


def choose_plan(
    device: str | None = None, cpu_threads: int | None = None, busy: float | None = None
) -> Plan:
    """The `preset` for ``device``, on the CPU with its threads chosen by `share_cores` now.

    The arguments are there to choose for another machine (and for tests). A run started on
    several ranks chooses its threads later, once every rank has started (``trainkit
    train`` does).
    """
    plan = preset(device)
    return share_cores(plan, cpu_threads, busy) if plan.device == "cpu" else plan


def preset(device: str | None = None) -> Plan:
    """The preset for ``device`` (default: CUDA when available, else the CPU); the CPU
    preset's threads are not chosen yet (see `share_cores`)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r} has no preset; use 'cpu' or 'cuda'")
    if device == "cuda":
        if torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
            return replace(GPU, precision="amp_fp16", notes=["no bf16 on this GPU: amp_fp16"])
        return GPU
    return CPU


def share_cores(plan: Plan, cpu_threads: int | None = None, busy: float | None = None) -> Plan:
    """``plan`` with torch's CPU threads: the cores that other work is not using right now.

    That is ``cpu_threads`` (default: the CPUs this process may use) minus the rounded
    number of ``busy`` cores (`busy_cores`: measured over a quarter of a second), at least
    one, shared by the ranks started together on this machine (torchrun's
    ``LOCAL_WORLD_SIZE``). Ranks must measure once all of them have started: a rank still
    importing torch is not other work. On 2 cores shared with other jobs, 2 OpenMP threads
    were measured 7x slower per step than 1 (each waits for the other at every op), while
    on idle cores 2 are ~1.7x faster.
    """
    cores = cpu_threads if cpu_threads is not None else _cpu_count()
    if busy is None:
        busy = busy_cores(cores)
    idle = max(1, cores - round(busy))
    ranks = _local_ranks()
    threads = max(1, idle // ranks)
    notes = list(plan.notes)
    if idle < cores:
        notes.append(
            f"{idle} of {cores} CPU threads: the machine is busy ({busy:.1f} cores in use)"
        )
    if ranks > 1:
        notes.append(f"{threads} thread(s) per rank: {ranks} ranks share {idle} idle cores")
    return replace(plan, threads=threads, notes=notes)


def _local_ranks() -> int:
    value = os.environ.get("LOCAL_WORLD_SIZE", "1")
    try:
        return max(1, int(value))
    except ValueError:
        raise ValueError(f"LOCAL_WORLD_SIZE must be an integer, got {value!r}") from None


def busy_cores(cores: int, seconds: float = 0.25, stat: str = "/proc/stat") -> float:
    """How many of this process's ``cores`` other processes keep busy, from the CPU times
    in ``stat`` over ``seconds`` (this process sleeps meanwhile), counted on the CPUs this
    process may run on; where there is no such file, the 1-minute load average (which lags:
    a job that ended a minute ago still counts).
    """
    try:
        allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        before = _cpu_times(stat, allowed)
        time.sleep(seconds)
        after = _cpu_times(stat, allowed)
    except (OSError, ValueError):
        return min(float(cores), os.getloadavg()[0]) if hasattr(os, "getloadavg") else 0.0
    total, idle = after[0] - before[0], after[1] - before[1]
    return cores * (total - idle) / total if total > 0 else 0.0


def _cpu_times(stat: str, allowed: set[int] | None) -> tuple[int, int]:
    """(all, idle) jiffies of the ``allowed`` CPUs (None: all), from /proc/stat's lines."""
    total = idle = 0
    with open(stat) as file:
        for line in file:
            name, *values = line.split()
            if not name.startswith("cpu") or name == "cpu":
                continue
            if allowed is not None and int(name[3:]) not in allowed:
                continue
            # user nice system idle iowait irq softirq steal (guest time is inside user)
            fields = [int(value) for value in values[:8]]
            total += sum(fields)
            idle += fields[3] + fields[4]
    if total == 0:
        raise ValueError(f"no per-CPU times in {stat}")
    return total, idle


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _parameters(n_layer: int, n_embd: int, n_positions: int) -> int:
    """GPT-2's parameter count over bytes (tied embeddings)."""
    block = 12 * n_embd * n_embd + 13 * n_embd
    return n_layer * block + (256 + n_positions) * n_embd + 2 * n_embd


def default_recipe() -> str | None:
    """The recipe the embedded default trains with: `DEFAULT_RECIPE` where installed
    (trainkit-algorithms), else none."""
    return DEFAULT_RECIPE if DEFAULT_RECIPE in plugins.available(RECIPES) else None


def default_config(plan: Plan, generate: bool = True, recipe: str | None = None) -> dict[str, Any]:
    """The run's config (the sections of a ``trainkit train`` YAML file) for ``plan``.

    ``generate``: sample with trainkit-loggers' ``generate`` callback (when installed).
    ``recipe``: train with this recipe (`trainkit.cli._recipe`); its schedule, if it sets
    one, replaces the default warmup-cosine one. None: the baseline.
    """
    config: dict[str, Any] = {
        "model": {
            "name": "tiny_gpt2",
            "n_layer": plan.n_layer,
            "n_head": plan.n_head,
            "n_embd": plan.n_embd,
            "n_positions": plan.seq_len,
        },
        "data": {
            "name": "stdlib_text",
            "seq_len": plan.seq_len,
            "batch_size": plan.batch_size,
            "site_packages": plan.site_packages,
            "max_bytes": plan.max_bytes,
        },
        "optimizers": {
            "name": "AdamW",
            "lr": plan.lr,
            "betas": [0.9, 0.95],
            "weight_decay": 0.0,
        },
        "schedulers": [
            {
                "name": f"{__name__}:WarmupCosine",
                "warmup_batches": plan.warmup_batches,
                "alpha_f": 0.05,
            }
        ],
        "checkpoint": {"interval": "0.5dur", "keep": 2},
        "trainer": {
            "max_duration": f"{plan.budget_s}sec",
            "eval_interval": "1dur",  # at the end only: on 2 busy cores one takes ~20 s
            "seed": 42,
            "device": plan.device,
            "precision": plan.precision,
            "compile": plan.compile,
        },
    }
    if recipe is not None:
        config["recipe"] = recipe
        if "schedulers" in recipe_sections(recipe):
            del config["schedulers"]
    if generate:
        config["callbacks"] = [
            {
                "name": "generate",
                "prompts": [PROMPT],
                "interval": "1dur",
                "max_new_tokens": plan.seq_len - len(PROMPT),
                "decoding": ["sample"],
                "temperature": 0.7,
                "table": "sample",
            }
        ]
    return config


@dataclass(kw_only=True)
class WarmupCosineConfig:
    warmup_batches: int = 30
    """Batches of linear warm-up from 0."""
    alpha_f: float = 0.05
    """The multiplier at the end of ``max_duration``."""

    def __post_init__(self) -> None:
        if isinstance(self.warmup_batches, bool) or not isinstance(self.warmup_batches, int):
            raise ValueError(f"warmup_batches must be an int >= 0, got {self.warmup_batches!r}")
        if self.warmup_batches < 0:
            raise ValueError(f"warmup_batches must be an int >= 0, got {self.warmup_batches}")
        if not 0 <= self.alpha_f <= 1:
            raise ValueError(f"alpha_f must be in [0, 1], got {self.alpha_f!r}")


class WarmupCosine(Configurable, config=WarmupCosineConfig):
    """Linear warm-up over ``warmup_batches`` batches, times half a cosine from 1 to
    ``alpha_f`` over the fraction of ``max_duration`` done (in any unit, seconds too).

    Unlike core's ``cosine_with_warmup``, the warm-up counts batches while the decay follows
    the run's duration: under a wall-clock ``max_duration`` the first (compiling) step can
    take a large share of the time, and a warm-up measured in time would then be over
    before the second step.
    """

    config: WarmupCosineConfig

    def __call__(self, state: State, ssr: float = 1.0) -> float:
        if ssr != 1.0:
            raise ValueError(f"WarmupCosine does not scale (scale_schedule_ratio {ssr}); use 1.0")
        warmup = self.config.warmup_batches
        warm = min(1.0, state.timestamp.batch / warmup) if warmup else 1.0
        done = min(state.elapsed_fraction(), 1.0)
        alpha = self.config.alpha_f
        return warm * (alpha + (1 - alpha) * 0.5 * (1 + math.cos(math.pi * done)))
