"""Algorithm figures, CPU-sized, measured in one run against a baseline in the same run.

1. Vision methods on torchvision's ResNet-18 (random init, 10 classes) over a small image
   set generated here (no downloads): coloured oriented gratings, a class per orientation
   and colour, with random phase, shift, contrast and noise. Each method trains the same
   steps on the same batches from the same weights as the baseline; printed are the
   step-time ratio over the whole run and the held-out accuracy difference.
2. Composition: ChannelsLast + BlurPool + LabelSmoothing + ProgressiveResizing against the
   slowest of the four alone (target: the combination is no slower per step, <= 1.00).
3. Step time of a small CNN with layer_freezing, selective_backprop, progressive_resizing.
4. With ``--alibi``: bench/alibi_extrapolation.py's ALiBi extrapolation figure.

    uv run python bench/algorithms.py                 # 1-3, a few minutes on 2 CPU cores
    uv run python bench/algorithms.py --only vision   # or composition, cnn
    uv run python bench/algorithms.py --alibi
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# CPU time is the step-time figure that survives a shared machine, but OpenMP threads that
# spin while waiting for a descheduled sibling burn CPU time: make them sleep instead (read
# once, when torch starts its thread pool).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainkit.algorithms import (
    AugMix,
    BlurPool,
    ChannelsLast,
    ColOut,
    Factorize,
    GhostBatchNorm,
    LabelSmoothing,
    LayerFreezing,
    ProgressiveResizing,
    RandAugment,
    SelectiveBackprop,
    SqueezeExcite,
    StochasticDepth,
    WeightStandardization,
)
from trainkit.core import Callback
from trainkit.trainer import Classifier, Trainer

CLASSES = 10


def gratings(n: int, seed: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` images (3, size, size) in [0, 1]: class = orientation (5) x colour (2)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    angle = (labels % 5).float() * math.pi / 5 + 0.15 * torch.randn(n, generator=g)
    frequency = 2 * math.pi / (8 + 6 * torch.rand(n, generator=g))  # periods of 8-14 pixels
    phase = 2 * math.pi * torch.rand(n, generator=g)
    axis = torch.arange(size, dtype=torch.float32)
    yy, xx = torch.meshgrid(axis, axis, indexing="ij")
    shift = torch.randint(-4, 5, (n, 2), generator=g).float()
    x = (xx[None] + shift[:, :1, None]) * torch.cos(angle)[:, None, None]
    y = (yy[None] + shift[:, 1:, None]) * torch.sin(angle)[:, None, None]
    wave = torch.sin(frequency[:, None, None] * (x + y) + phase[:, None, None])
    contrast = 0.25 + 0.2 * torch.rand(n, 1, 1, generator=g)
    tint = torch.tensor([[0.9, 0.5, 0.2], [0.2, 0.5, 0.9]])[labels // 5]  # (n, 3)
    images = 0.5 + contrast[:, None] * wave[:, None] * tint[:, :, None, None]
    images = images + 0.08 * torch.randn(n, 3, size, size, generator=g)
    return images.clamp(0, 1), labels


def resnet18() -> nn.Module:
    from torchvision.models import resnet18 as build

    torch.manual_seed(0)
    return build(num_classes=CLASSES)


class StepTimer(Callback):
    """Wall and CPU (this process's) time of every training batch, from BEFORE_DATALOADER
    (so loading and batch augmentations count) to BATCH_END."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.cpu_seconds: list[float] = []
        self._start = self._cpu_start = 0.0

    def before_dataloader(self, state: Any, logger: Any) -> None:
        self._start, self._cpu_start = time.perf_counter(), time.process_time()

    def batch_end(self, state: Any, logger: Any) -> None:
        self.seconds.append(time.perf_counter() - self._start)
        self.cpu_seconds.append(time.process_time() - self._cpu_start)


def run(algorithms: list[Any], data: TensorDataset, held_out: tuple, steps: int, batch: int):
    """Train ResNet-18 for ``steps`` batches; returns (mean CPU s/step after warm-up, mean
    wall s/step, held-out accuracy)."""
    model = Classifier(resnet18(), num_classes=CLASSES)
    timer = StepTimer()
    trainer = Trainer(
        model=model,
        train_dataloader=DataLoader(data, batch_size=batch, shuffle=False),
        optimizers=torch.optim.Adam(model.parameters(), lr=2e-3),
        max_duration=f"{steps}ba",
        algorithms=algorithms,
        callbacks=[timer],
        progress_bar=False,
        device="cpu",
        seed=0,
    )
    trainer.fit()
    images, labels = held_out
    net = trainer.state.model.module
    net.eval()
    with torch.no_grad():
        predictions = torch.cat([net(x).argmax(1) for x in images.split(256)])
    accuracy = (predictions == labels).float().mean().item()
    # The first batches pay one-off costs (allocation, kernel selection).
    return statistics.fmean(timer.cpu_seconds[3:]), statistics.fmean(timer.seconds[3:]), accuracy


VISION: dict[str, Callable[[], list[Any]]] = {
    "baseline": lambda: [],
    "blurpool": lambda: [BlurPool()],
    "channels_last": lambda: [ChannelsLast()],
    "squeeze_excite": lambda: [SqueezeExcite()],
    "stochastic_depth": lambda: [StochasticDepth(target="BasicBlock", drop_rate=0.2)],
    "factorize": lambda: [Factorize()],
    "ghost_batchnorm": lambda: [GhostBatchNorm(ghost_batch_size=8)],
    "weight_standardization": lambda: [WeightStandardization()],
    "progressive_resizing": lambda: [ProgressiveResizing()],
    "colout": lambda: [ColOut()],
    "randaugment": lambda: [RandAugment()],
    "augmix": lambda: [AugMix()],
    "label_smoothing": lambda: [LabelSmoothing(smoothing=0.1)],
    "cl+blurpool+ls+pr": lambda: [
        ChannelsLast(),
        BlurPool(),
        LabelSmoothing(smoothing=0.1),
        ProgressiveResizing(),
    ],
}
MEMBERS = ("channels_last", "blurpool", "label_smoothing", "progressive_resizing")


def vision_figure(
    names: list[str], steps: int, batch: int, size: int = 32, title: str = "Vision methods"
) -> dict[str, tuple[float, ...]]:
    images, labels = gratings(steps * batch, seed=0, size=size)
    held_out = gratings(1024, seed=1, size=size)
    data = TensorDataset(images, labels)
    # A throwaway run first: the first run in a process pays one-off costs (oneDNN kernels
    # created per shape, allocator growth) that would otherwise count against the baseline.
    run([], data, (held_out[0][:8], held_out[1][:8]), 5, batch)
    results = {}
    for name in ["baseline", *[n for n in names if n != "baseline"]]:
        start = time.perf_counter()
        results[name] = run(VISION[name](), data, held_out, steps, batch)
        cpu, wall, accuracy = results[name]
        print(
            f"    {name:<24} {cpu * 1000:7.1f} CPU ms/step {wall * 1000:7.1f} wall ms/step  "
            f"accuracy {accuracy:.3f}  ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
    base_cpu, base_wall, base_accuracy = results["baseline"]
    print(
        f"{title} on torchvision ResNet-18 ({steps} steps of {batch} generated "
        f"{size}x{size} images, 10 classes, Adam; held-out accuracy on 1024 images):"
    )
    print(f"  {'method':<24}{'CPU time ratio':>15}{'wall ratio':>11}{'accuracy':>10}{'diff':>8}")
    for name, (cpu, wall, accuracy) in results.items():
        print(
            f"  {name:<24}{cpu / base_cpu:15.2f}{wall / base_wall:11.2f}{accuracy:10.3f}"
            f"{accuracy - base_accuracy:+8.3f}"
        )
    return results


def composition_figure(results: dict[str, tuple[float, ...]]) -> None:
    combined = results["cl+blurpool+ls+pr"][0]
    slowest = max(MEMBERS, key=lambda name: results[name][0])
    ratio = combined / results[slowest][0]
    members = ", ".join(f"{n} {results[n][0] * 1000:.0f}" for n in MEMBERS)
    print(f"Composition (CPU ms/step): {members}; all four {combined * 1000:.0f}")
    print(f"  all four / baseline: {combined / results['baseline'][0]:.2f}")
    print(
        f"summary: ChannelsLast+BlurPool+LabelSmoothing+ProgressiveResizing / slowest member "
        f"({slowest}) = {ratio:.2f} (target <= 1.00)"
    )


def cnn() -> Classifier:
    torch.manual_seed(0)
    body = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )
    return Classifier(body, num_classes=10)


def cnn_figure(steps: int) -> None:
    torch.manual_seed(0)
    images = torch.rand(steps * 32, 3, 32, 32)
    labels = torch.randint(0, 10, (steps * 32,))
    runs = {
        "baseline": [],
        "layer_freezing": [LayerFreezing(freeze_start=0.3, freeze_level=0.8)],
        "selective_backprop": [SelectiveBackprop(start=0.2, end=0.9, keep=0.5, interrupt=2)],
        "progressive_resizing": [ProgressiveResizing(initial_scale=0.5, delay_fraction=0.3)],
    }
    seconds = {}
    for name, algorithms in runs.items():
        model = cnn()
        timer = StepTimer()
        Trainer(
            model=model,
            train_dataloader=DataLoader(TensorDataset(images, labels), batch_size=32),
            optimizers=torch.optim.SGD(model.parameters(), lr=0.05),
            max_duration=f"{steps}ba",
            algorithms=algorithms,
            callbacks=[timer],
            progress_bar=False,
            device="cpu",
            seed=0,
        ).fit()
        seconds[name] = statistics.fmean(timer.seconds[5:])
    base = seconds["baseline"]
    print(f"Step time over a {steps}-batch run of a small CNN (32x32 images, batch 32):")
    for name, value in seconds.items():
        print(f"  {name:<21} {value * 1000:7.1f} ms/step  ratio {value / base:.2f}")


def alibi_figure() -> None:
    path = Path(__file__).with_name("alibi_extrapolation.py")
    if not path.exists():
        print("ALiBi extrapolation: skipped, bench/alibi_extrapolation.py is not there")
        return
    spec = importlib.util.spec_from_file_location("alibi_extrapolation", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    figures = module.alibi_extrapolation()
    report = getattr(module, "report", None)
    if report is not None:
        report(figures)
    else:
        print(f"ALiBi extrapolation: {figures}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="ResNet-18 steps per method")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--cnn-steps", type=int, default=100)
    parser.add_argument(
        "--composition-size",
        type=int,
        default=64,
        help="image size of the composition runs (at 32 px ResNet-18's last stage works on "
        "1x1 maps at full and half size alike, which hides what resizing saves)",
    )
    parser.add_argument("--composition-steps", type=int, default=24)
    parser.add_argument("--composition-batch", type=int, default=16)
    parser.add_argument(
        "--only",
        default="vision,composition,cnn",
        help="comma-separated: vision, composition, cnn (composition runs its members)",
    )
    parser.add_argument("--methods", default=",".join(VISION), help="vision methods to run")
    parser.add_argument("--alibi", action="store_true", help="also the ALiBi figure (minutes)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sections = set(args.only.split(","))
    if "vision" in sections:
        vision_figure([n for n in args.methods.split(",") if n], args.steps, args.batch)
    if "composition" in sections:
        results = vision_figure(
            ["cl+blurpool+ls+pr", *MEMBERS],
            args.composition_steps,
            args.composition_batch,
            args.composition_size,
            title="Composition",
        )
        composition_figure(results)
    if "cnn" in sections:
        cnn_figure(args.cnn_steps)
    if args.alibi:
        alibi_figure()


if __name__ == "__main__":
    main()
