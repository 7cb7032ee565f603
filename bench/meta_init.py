"""Peak memory per rank while a model is prepared for training: built whole on every rank
and sharded by FSDP, against built on the meta device and materialised block by block.

Each rank (forked, gloo on CPU) builds a stack of residual blocks and hands it to a
Trainer with ``FSDP()``; the figure is the growth of the rank's resident memory, its
largest value (sampled every millisecond) from before the model is built to the end of
the Trainer's set-up, over the model's size in bytes; a set-up on a tiny model first
takes what FSDP and the Trainer allocate once. The script runs itself with glibc's mmap
threshold fixed (``MALLOC_MMAP_THRESHOLD_``), so freed blocks go back to the OS. Built whole, each rank holds the model at least once (~1.0,
more with the copies FSDP makes while sharding); built on the meta device it should hold
its shards and one block: ~1/N plus a block.

    uv run python bench/meta_init.py                      # 1, 2 and 4 ranks, ~270 MB model
    uv run python bench/meta_init.py --width 512 --depth 8 --worlds 1,2
"""

from __future__ import annotations

import argparse
import datetime
import gc
import multiprocessing as mp
import os
import socket
import sys
import threading
from typing import Any

import torch
import torch.distributed as tdist
from torch import nn
from torch.nn import functional as F

from trainkit.core import TrainModel
from trainkit.parallel import FSDP
from trainkit.trainer import Trainer


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Stack(TrainModel):
    def __init__(self, width: int, depth: int):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 2)

    def forward(self, batch: Any) -> torch.Tensor:
        hidden = batch[0]
        for block in self.blocks:
            hidden = block(hidden)
        return self.head(hidden)

    def loss(self, outputs: Any, batch: Any) -> torch.Tensor:
        return F.cross_entropy(outputs, batch[1])


def current_mb() -> float:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Sampler:
    """The largest resident memory seen while inside, read every millisecond by a thread."""

    def __init__(self) -> None:
        self.peak, self._done = current_mb(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._done.wait(0.001):
            self.peak = max(self.peak, current_mb())

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, current_mb())


def rank_main(rank: int, world: int, port: int, args: argparse.Namespace, meta: bool, out: Any):
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    tdist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
    )
    try:
        # A first set-up on a tiny model: what FSDP and the Trainer import and allocate once
        # is then already there, not counted against the model.
        Trainer(model=Stack(8, 1), parallelism=FSDP(), device="cpu", progress_bar=False)
        gc.collect()
        before = current_mb()
        with Sampler() as sampler:
            with torch.device("meta") if meta else torch.device("cpu"):
                model = Stack(args.width, args.depth)
            Trainer(model=model, parallelism=FSDP(), device="cpu", seed=0, progress_bar=False)
        out.send(sampler.peak - before)
    finally:
        tdist.destroy_process_group()


def growth(world: int, args: argparse.Namespace, meta: bool) -> float:
    """The largest growth of peak memory over the ranks, in MB."""
    context = mp.get_context("fork")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    pipes, procs = [], []
    for rank in range(world):
        receiver, sender = context.Pipe(duplex=False)
        proc = context.Process(target=rank_main, args=(rank, world, port, args, meta, sender))
        proc.start()
        pipes.append(receiver)
        procs.append(proc)
    results = [pipe.recv() for pipe in pipes]
    for proc in procs:
        proc.join()
    return max(results)


def main() -> None:
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        # glibc raises its mmap threshold each time a large block is freed, then keeps
        # later freed blocks of that size for reuse instead of returning them: the resident
        # memory would then count each block materialised and freed again. A fixed
        # threshold returns them, so the figure is what the process holds.
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)
        os.execv(sys.executable, [sys.executable, *sys.argv])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=16)
    parser.add_argument("--worlds", default="1,2,4")
    args = parser.parse_args()
    model_mb = sum(p.numel() for p in Stack(args.width, args.depth).parameters()) * 4 / 2**20
    block_mb = sum(p.numel() for p in Block(args.width).parameters()) * 4 / 2**20
    print(f"model {model_mb:.0f} MB ({args.depth} blocks of {block_mb:.1f} MB), fp32")
    print(f"{'ranks':>5s} {'whole, MB':>10s} {'/model':>7s} {'meta, MB':>9s} {'/model':>7s}"
          f" {'1/N + block':>11s}")  # fmt: skip
    for world in [int(w) for w in args.worlds.split(",")]:
        whole, meta = growth(world, args, meta=False), growth(world, args, meta=True)
        ideal = (model_mb / world + block_mb) / model_mb
        print(
            f"{world:5d} {whole:10.0f} {whole / model_mb:7.2f} {meta:9.0f} "
            f"{meta / model_mb:7.2f} {ideal:11.2f}"
        )


if __name__ == "__main__":
    main()
