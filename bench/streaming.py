"""Streaming from a local MDS folder against the map-style loader over the same data.

The data is the embedded default's (``trainkit train``): byte windows of the Python
standard library's source, 128 bytes each, as trainkit-cli's ``stdlib_text`` loads them
into memory; or, with ``--data images``, generated 3x32x32 uint8 images with a label. It
is written once as MDS shards (`trainkit.core.data.write_mds`), then both loaders go
through whole epochs, alternately, with the same batch size and worker count:

- map: ``DataLoader(dataset, batch_size, shuffle=True)`` over the in-memory data set;
- streaming: ``streaming_loader(local=<mds>, batch_size)``, a shuffled StreamingDataset
  reading the shards from disk (no remote: nothing is downloaded).

Printed: samples/s of each (median over repeats) and the ratio streaming / map.

    uv run python bench/streaming.py                       # ~1 min on 2 CPU cores
    uv run python bench/streaming.py --data images --num-workers 2 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's folder leads sys.path, and this file would shadow MosaicML
# Streaming's own `streaming` module.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from trainkit.trainer.streaming import streaming_loader, write_mds  # noqa: E402


class Images(Dataset):
    """``n`` generated 3x32x32 uint8 images with a class label, as a map-style data set."""

    def __init__(self, n: int):
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=generator)
        self.labels = torch.randint(0, 10, (n,), generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"image": self.images[i], "label": self.labels[i]}


def _data(kind: str, samples: int) -> tuple[Dataset, dict[str, str]]:
    if kind == "images":
        return Images(samples), {"image": "ndarray:uint8:3,32,32", "label": "int64"}
    from trainkit.cli._default import stdlib_text

    dataset = stdlib_text(seq_len=128, max_bytes=samples * 128, eval_bytes=4096)["train"].dataset
    columns = {"input_ids": "ndarray:uint8:128", "labels": "ndarray:uint8:128"}
    return dataset, columns


def _epoch(loader: Any) -> tuple[int, float]:
    started, count = time.perf_counter(), 0
    for batch in loader:
        first = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
        count += first.shape[0]
    return count, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", choices=["text", "images"], default="text")
    parser.add_argument("--samples", type=int, default=30_000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5, help="epochs of each loader")
    parser.add_argument("--compression", default=None, help="MDS shard compression (zstd, ...)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    dataset, columns = _data(args.data, args.samples)
    with tempfile.TemporaryDirectory() as tmp:
        mds = Path(tmp) / "mds"
        started = time.perf_counter()
        written = write_mds(dataset, mds, columns=columns, compression=args.compression)
        size = sum(p.stat().st_size for p in mds.iterdir())
        print(f"setup: {args.data}, {written} samples written as MDS in "
              f"{time.perf_counter() - started:.1f} s ({size / 2**20:.1f} MiB, "
              f"{len(list(mds.glob('*.mds*')))} shards); batch {args.batch_size}, "
              f"{args.num_workers} workers, {args.threads} torch threads")  # fmt: skip
        map_loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                num_workers=args.num_workers,
                                persistent_workers=args.num_workers > 0)  # fmt: skip
        stream_loader = streaming_loader(local=mds, batch_size=args.batch_size,
                                         num_workers=args.num_workers, drop_last=False)  # fmt: skip
        loaders = {"map": map_loader, "streaming": stream_loader}
        for loader in loaders.values():
            _epoch(loader)  # warm-up: workers started, files in the page cache
        rates: dict[str, list[float]] = {name: [] for name in loaders}
        for repeat in range(args.repeats):
            order = list(loaders) if repeat % 2 == 0 else list(reversed(loaders))
            for name in order:
                count, seconds = _epoch(loaders[name])
                assert count == len(dataset), (name, count)
                rates[name].append(count / seconds)
        for name, values in rates.items():
            print(f"{name:>10}: {statistics.median(values):10,.0f} samples/s "
                  f"(min {min(values):,.0f}, max {max(values):,.0f})")  # fmt: skip
        ratios = [s / m for s, m in zip(rates["streaming"], rates["map"], strict=True)]
        print(f"summary: streaming / map-style samples/s = {statistics.median(ratios):.2f} "
              f"(median of {args.repeats} paired epochs, {args.data}; above 1.00 is faster)")  # fmt: skip


if __name__ == "__main__":
    main()
