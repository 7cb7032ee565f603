"""Checkpoint I/O, measured in one run against baselines on the same disk.

- save / load throughput of trainkit (DCP + manifest + sha256) for a ~1 GB model and
  AdamW state, vs torch.save / torch.load(weights_only=True) of the same tensors, vs the
  disk's sequential bandwidth (dd, with the page cache dropped where allowed);
- async_save: how long training is blocked, as a fraction of a synchronous save;
- elastic load: a checkpoint saved with FSDP2 on 4 ranks loaded on 2 ranks, vs saved and
  loaded on 2 ranks (smaller model; forked gloo ranks, see tests/multirank.py).

    uv run python bench/checkpoint_io.py [--gb 1.0] [--folder /tmp/tk-bench]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
import conftest  # noqa: F401  (imports fsdp/dcp before forking ranks)
from multirank import run_ranks
from trainkit.checkpoint import load_checkpoint, save_checkpoint
from trainkit.core import State


def drop_caches() -> bool:
    with contextlib.suppress(OSError):
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    return False


def dd_bandwidth(folder: Path, megabytes: int) -> tuple[float, float]:
    target = folder / "dd.bin"
    start = time.perf_counter()
    subprocess.run(
        [
            "dd",
            "if=/dev/zero",
            f"of={target}",
            "bs=16M",
            f"count={megabytes // 16}",
            "conv=fdatasync",
        ],
        check=True,
        capture_output=True,
    )
    write = megabytes / (time.perf_counter() - start)
    drop_caches()
    start = time.perf_counter()
    subprocess.run(
        ["dd", f"if={target}", "of=/dev/null", "bs=16M"], check=True, capture_output=True
    )
    read = megabytes / (time.perf_counter() - start)
    target.unlink()
    return write, read


def make_state(gigabytes: float) -> State:
    # fp32 weights + AdamW's two moments: 12 bytes a parameter.
    width = 4096
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


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def single_process(folder: Path, gigabytes: float) -> None:
    state = make_state(gigabytes)
    size_mb = sum(t.numel() * t.element_size() for t in state.model.parameters()) * 3 / 1e6
    dd_write, dd_read = dd_bandwidth(folder, int(size_mb))
    plain = {"model": state.model.state_dict(), "optim": state.optimizers[0].state_dict()}

    torch_save = timed(lambda: torch.save(plain, folder / "plain.pt"))
    torch_save_durable = timed(lambda: _save_durably(plain, folder / "durable.pt"))
    drop_caches()
    torch_load = timed(lambda: torch.load(folder / "plain.pt", weights_only=True))
    trainkit_save = timed(lambda: save_checkpoint(state, folder / "ckpt"))
    dropped = drop_caches()
    trainkit_load = timed(lambda: load_checkpoint(state, folder / "ckpt"))
    pending = None

    def start_async():
        nonlocal pending
        pending = save_checkpoint(state, folder / "ckpt-async", async_save=True)

    blocked = timed(start_async)
    total_async = blocked + timed(pending.wait)

    print(f"state: {size_mb:.0f} MB (model + AdamW), page cache dropped before reads: {dropped}")
    print(f"disk (dd): write {dd_write:.0f} MB/s, read {dd_read:.0f} MB/s")
    print(
        f"save: trainkit {size_mb / trainkit_save:.0f} MB/s ({trainkit_save:.2f} s) vs torch.save {size_mb / torch_save:.0f} MB/s ({torch_save:.2f} s): ratio {trainkit_save / torch_save:.2f}"
    )
    print(
        f"load: trainkit {size_mb / trainkit_load:.0f} MB/s ({trainkit_load:.2f} s, sha256 verified) vs torch.load {size_mb / torch_load:.0f} MB/s ({torch_load:.2f} s): ratio {trainkit_load / torch_load:.2f}"
    )
    print(
        f"save: vs torch.save + fsync (durable, as trainkit's is) {size_mb / torch_save_durable:.0f} MB/s ({torch_save_durable:.2f} s): ratio {trainkit_save / torch_save_durable:.2f}"
    )
    print(f"save vs disk write bandwidth: {size_mb / trainkit_save / dd_write:.2f}")
    print(
        f"async save: training blocked {blocked:.2f} s = {blocked / trainkit_save:.0%} of a synchronous save (target <= 20%); write finished after {total_async:.2f} s"
    )


def _elastic_save(rank: int, world: int, folder: str, gigabytes: float) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    state = make_state(gigabytes)
    for layer in state.model:
        fully_shard(layer)
    fully_shard(state.model)
    state.optimizers = [torch.optim.AdamW(state.model.parameters(), lr=1e-4)]
    save_checkpoint(state, Path(folder))


def _elastic_load(rank: int, world: int, folder: str, gigabytes: float) -> float:
    from torch.distributed.fsdp import fully_shard

    state = make_state(gigabytes)
    for layer in state.model:
        fully_shard(layer)
    fully_shard(state.model)
    state.optimizers = [torch.optim.AdamW(state.model.parameters(), lr=1e-4)]
    torch.distributed.barrier()
    start = time.perf_counter()
    load_checkpoint(state, Path(folder))
    return time.perf_counter() - start


def elastic(folder: Path, gigabytes: float) -> None:
    run_ranks(_elastic_save, 4, str(folder / "from4"), gigabytes, timeout=900)
    run_ranks(_elastic_save, 2, str(folder / "from2"), gigabytes, timeout=900)
    same = max(run_ranks(_elastic_load, 2, str(folder / "from2"), gigabytes, timeout=900))
    moved = max(run_ranks(_elastic_load, 2, str(folder / "from4"), gigabytes, timeout=900))
    print(
        f"elastic load of {gigabytes:.2f} GB on 2 ranks: saved on 4 ranks {moved:.2f} s vs saved on 2 ranks {same:.2f} s: ratio {moved / same:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="model + optimizer state size")
    parser.add_argument("--elastic-gb", type=float, default=0.25)
    parser.add_argument("--folder", type=Path, default=None)
    args = parser.parse_args()
    folder = args.folder or Path(tempfile.mkdtemp(prefix="tk-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        single_process(folder, args.gb)
        elastic(folder, args.elastic_gb)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
