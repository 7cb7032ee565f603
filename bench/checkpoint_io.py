"""Checkpoint I/O, measured in one run against baselines on the same disk.

- save: trainkit's synchronous save (DCP shards checksummed while written, fsynced,
  manifest, ``latest``) of a model with AdamW state, vs ``torch.save`` + fsync of the same
  tensors, vs the disk's sequential write (dd with fdatasync);
- cold load: trainkit's load (every file's checksum verified, then read into the model and
  optimizer) with the page cache dropped, vs ``torch.load(weights_only=True)`` cold, vs dd's
  cold read;
- async save: how long training is blocked (until ``save_checkpoint(async_save=True)``
  returns; the host buffers are reused from the previous save, as a Checkpointer's are), as
  a fraction of the median synchronous save;
- elastic load (``--elastic-size``): a checkpoint saved with FSDP2 on 4 ranks loaded on 2,
  vs saved and loaded on 2 (forked gloo ranks, see tests/multirank.py).

Each figure is min / median / max over ``--runs`` runs (5), the variants interleaved so
that drift of a shared machine spreads over all of them (and trainkit going first every
other run); ratios are taken run by run (the two measured back to back) and their median
shown with each run's. Targets (issue 17):
save <= 1.0x torch.save + fsync, cold load <= 1.0x torch.load, async blocked <= 10% of a
synchronous save.

    uv run python bench/checkpoint_io.py                  # ~1 GB of model + AdamW state
    uv run python bench/checkpoint_io.py --size 0.1 --runs 3 --elastic-size 0
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
import conftest  # noqa: F401  (imports fsdp/dcp before forking ranks)
from multirank import run_ranks
from trainkit.checkpoint import load_checkpoint, save_checkpoint
from trainkit.core import State


def drop_caches() -> bool:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    return False


def settle(seconds: float = 3.0) -> None:
    """Flush what is written and let the disk (and a VM host's cache under it) drain."""
    os.sync()
    time.sleep(seconds)


def dd(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(["dd", *args], check=True, capture_output=True)
    return time.perf_counter() - start


def make_state(gigabytes: float) -> State:
    # fp32 weights + AdamW's two moments: 12 bytes a parameter.
    width = 1024 if gigabytes < 0.2 else 4096
    layers = max(1, round(gigabytes * 1e9 / 12 / (width * width)))
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    optimizer.step()
    return State(model=model, optimizers=[optimizer])


def _save_durably(obj: object, path: Path) -> None:
    with open(path, "wb") as stream:
        torch.save(obj, stream)
        stream.flush()
        os.fsync(stream.fileno())


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f} s"


def single_process(folder: Path, gigabytes: float, runs: int, checksum: str) -> None:
    state = make_state(gigabytes)
    nbytes = sum(t.numel() * t.element_size() for t in state.model.parameters()) * 3
    megabytes = nbytes / 1e6
    plain = {"model": state.model.state_dict(), "optim": state.optimizers[0].state_dict()}
    times: dict[str, list[float]] = {}

    def record(name: str, seconds: float) -> None:
        times.setdefault(name, []).append(seconds)

    count = max(1, int(megabytes // 16))
    warm = save_checkpoint(state, folder / "warm", async_save=True, checksum=checksum)
    warm.wait()  # allocates the async save's host buffers once, as a run's first save does
    shutil.rmtree(folder / "warm")
    dropped = False
    for run in range(runs):
        dropped = _one_run(folder, state, plain, f"{run}", count, checksum, record)

    med = {name: statistics.median(values) for name, values in times.items()}
    print(f"state: {megabytes:.0f} MB (fp32 model + AdamW), checksum {checksum}, {runs} runs, "
          f"page cache dropped before cold reads: {dropped}")  # fmt: skip
    print("figures: min / median / max")
    for name in ("dd write", "dd read", "torch.save+fsync", "trainkit save", "torch.load",
                 "trainkit load", "async blocked", "async total"):  # fmt: skip
        rate = megabytes / med[name] if "async" not in name else 0
        extra = f"  ({rate:.0f} MB/s at the median)" if rate else ""
        print(f"  {name:<17} {spread(times[name])}{extra}")

    def paired(ours: str, theirs: str) -> str:
        # Run by run (the two measured back to back), so that drift of a shared disk cancels.
        ratios = [a / b for a, b in zip(times[ours], times[theirs], strict=True)]
        runs = ", ".join(f"{r:.2f}" for r in ratios)
        return f"{statistics.median(ratios):.2f} (runs: {runs})"

    print(f"save:  trainkit / (torch.save + fsync) = {paired('trainkit save', 'torch.save+fsync')}"
          f" (target <= 1.0); trainkit / dd write = {paired('trainkit save', 'dd write')}")  # fmt: skip
    print(f"load:  trainkit / torch.load (cold) = {paired('trainkit load', 'torch.load')}"
          f" (target <= 1.0); trainkit / dd read = {paired('trainkit load', 'dd read')}")  # fmt: skip
    blocked = paired("async blocked", "trainkit save")
    print(f"async: training blocked / synchronous save = {blocked} (target <= 0.10)")


def _one_run(
    folder: Path,
    state: State,
    plain: dict,
    run: str,
    count: int,
    checksum: str,
    record: Callable[[str, float], None],
) -> bool:
    """One round of every measurement; whether the page cache could be dropped."""
    ckpt, later = folder / f"ckpt{run}", folder / f"async{run}"
    settle()
    record("dd write", dd(["if=/dev/zero", f"of={folder}/dd.bin", "bs=16M", f"count={count}",
                           "conv=fdatasync"]))  # fmt: skip
    dropped = drop_caches()
    record("dd read", dd([f"if={folder}/dd.bin", "of=/dev/null", "bs=16M"]))
    (folder / "dd.bin").unlink()
    saves = [
        ("torch.save+fsync", lambda: _save_durably(plain, folder / "plain.pt")),
        ("trainkit save", lambda: save_checkpoint(state, ckpt, checksum=checksum)),
    ]
    loads = [
        ("torch.load", lambda: torch.load(folder / "plain.pt", weights_only=True)),
        ("trainkit load", lambda: load_checkpoint(state, ckpt)),
    ]
    if int(run) % 2:  # every other run the other way round: what goes first pays no less
        saves.reverse()
        loads.reverse()
    for name, save in saves:
        settle()  # each starts on an idle disk, with nothing of the other's left to write
        record(name, timed(save))
    for name, load in loads:
        drop_caches()
        record(name, timed(load))
    start = time.perf_counter()
    pending = save_checkpoint(state, later, async_save=True, checksum=checksum)
    record("async blocked", time.perf_counter() - start)
    pending.wait()
    record("async total", time.perf_counter() - start)
    for path in (ckpt, later):
        shutil.rmtree(path)
    (folder / "plain.pt").unlink()
    return dropped


def _sharded_state(gigabytes: float) -> State:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    state = make_state(gigabytes)
    for layer in state.model:
        fully_shard(layer)
    fully_shard(state.model)
    state.optimizers = [torch.optim.AdamW(state.model.parameters(), lr=1e-4)]
    return state


def _elastic_save(rank: int, world: int, folder: str, gigabytes: float) -> None:
    save_checkpoint(_sharded_state(gigabytes), Path(folder))


def _elastic_load(rank: int, world: int, folder: str, gigabytes: float) -> float:
    state = _sharded_state(gigabytes)
    torch.distributed.barrier()
    start = time.perf_counter()
    load_checkpoint(state, Path(folder))
    return time.perf_counter() - start


def elastic(folder: Path, gigabytes: float) -> None:
    run_ranks(_elastic_save, 4, str(folder / "from4"), gigabytes, timeout=900)
    run_ranks(_elastic_save, 2, str(folder / "from2"), gigabytes, timeout=900)
    same = max(run_ranks(_elastic_load, 2, str(folder / "from2"), gigabytes, timeout=900))
    moved = max(run_ranks(_elastic_load, 2, str(folder / "from4"), gigabytes, timeout=900))
    print(f"elastic load of {gigabytes:.2f} GB on 2 ranks: saved on 4 ranks {moved:.2f} s vs "
          f"saved on 2 ranks {same:.2f} s: ratio {moved / same:.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", "--gb", type=float, default=1.0,
                        help="model + AdamW state, in GB (default 1.0)")  # fmt: skip
    parser.add_argument("--runs", type=int, default=5, help="runs of each measurement")
    parser.add_argument("--checksum", default="xxh3_128", choices=["xxh3_128", "sha256"])
    parser.add_argument("--elastic-size", "--elastic-gb", type=float, default=0.25,
                        help="state size of the elastic-load measurement (0: skip it)")  # fmt: skip
    parser.add_argument("--folder", type=Path, default=None, help="on the disk to measure")
    args = parser.parse_args()
    folder = args.folder or Path(tempfile.mkdtemp(prefix="tk-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        single_process(folder, args.size, args.runs, args.checksum)
        if args.elastic_size > 0:
            elastic(folder, args.elastic_size)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
