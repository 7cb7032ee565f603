"""Activation memory and step time of `ActivationCheckpointing`'s modes against none.

A stack of MLP blocks (LayerNorm, Linear 4x, GELU, Linear) runs forward and backward on the
same input in each mode: ``full``, ``selective`` and ``offload`` against no checkpointing.
The memory figure is what the forward leaves held for the backward beyond the model and the
input: on CUDA ``torch.cuda.memory_allocated``; on CPU the process's resident memory, with
glibc's mmap threshold fixed (``MALLOC_MMAP_THRESHOLD_``, set by the script), so that each
freed tensor goes back to the OS and resident memory follows the live tensors. The time is
the median of ``--repeats`` forward+backward steps, as a ratio to no checkpointing (modes in
turn, so a slow spell of a shared machine falls on all).

    uv run python bench/activation_memory.py
    uv run python bench/activation_memory.py --width 2048 --tokens 8192 --depth 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

MODES = (None, "full", "selective", "offload")


def current_mb() -> float:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:  # freed tensors back to the OS at once
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)
        os.execv(sys.executable, [sys.executable, *sys.argv])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=4096, help="rows of the input")
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import torch
    from torch import nn
    from torch.nn import functional as F

    from trainkit.algorithms import apply_activation_checkpointing

    class Block(nn.Module):
        def __init__(self, width: int):
            super().__init__()
            self.norm = nn.LayerNorm(width)
            self.up = nn.Linear(width, 4 * width)
            self.down = nn.Linear(4 * width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(F.gelu(self.up(self.norm(x))))

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")

    def build(mode: str | None) -> nn.Module:
        torch.manual_seed(0)
        holder = nn.Module()
        holder.blocks = nn.ModuleList(Block(args.width) for _ in range(args.depth)).to(device)
        if mode is not None:
            apply_activation_checkpointing(holder, mode)
        return holder

    def held_mb() -> float:
        return torch.cuda.memory_allocated() / 2**20 if cuda else current_mb()

    def step(holder: nn.Module, x: torch.Tensor) -> float:
        """One forward and backward; returns what the forward left held (MB)."""
        before = held_mb()
        hidden = x
        for block in holder.blocks:
            hidden = block(hidden)
        loss = hidden.float().pow(2).mean()
        held = held_mb() - before
        loss.backward()
        return held

    x = torch.randn(args.tokens, args.width, device=device, requires_grad=True)
    models = {mode: build(mode) for mode in MODES}
    held = {mode: step(models[mode], x) for mode in MODES}  # also the warm-up
    times: dict[str | None, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.repeats):
        for mode in MODES:
            if cuda:
                torch.cuda.synchronize()
            started = time.perf_counter()
            step(models[mode], x)
            if cuda:
                torch.cuda.synchronize()
            times[mode].append(time.perf_counter() - started)
    base_time = statistics.median(times[None])
    where = torch.cuda.get_device_name(0) if cuda else "cpu (resident memory)"
    print(
        f"{where}: {args.depth} blocks of width {args.width}, {args.tokens} rows; "
        f"median of {args.repeats} steps"
    )
    print(f"{'mode':10s} {'held MB':>9s} {'/ none':>7s} {'step time / none':>17s}")
    for mode in MODES:
        ratio = statistics.median(times[mode]) / base_time
        print(
            f"{mode or 'none':10s} {held[mode]:9.1f} {held[mode] / held[None]:7.2f} {ratio:17.2f}"
        )


if __name__ == "__main__":
    main()
