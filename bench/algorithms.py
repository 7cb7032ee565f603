"""Algorithm figures, CPU-sized, measured in one run.

1. ALiBi extrapolation: a small byte-level GPT-2 (random init) trained on the Python
   standard library's source at length 64, evaluated on held-out text at 64 / 128 / 256,
   with ALiBi vs learned position embeddings (n_positions=256, so it can run at 256, but
   trained only on positions < 64).
2. Step time over a whole run of a small CNN on synthetic images: layer_freezing,
   selective_backprop and progressive_resizing vs the same run without them.

    uv run python bench/algorithms.py [--steps 300]
"""

from __future__ import annotations

import argparse
import sysconfig
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainkit.algorithms import Alibi, LayerFreezing, ProgressiveResizing, SelectiveBackprop
from trainkit.core import Classifier, HuggingFaceModel, Trainer


def stdlib_bytes(limit: int) -> torch.Tensor:
    root = Path(sysconfig.get_paths()["stdlib"])
    data = b"".join(p.read_bytes() for p in sorted(root.glob("*.py")))[:limit]
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def windows(data: torch.Tensor, length: int) -> list[dict[str, torch.Tensor]]:
    rows = data[: len(data) // length * length].view(-1, length)
    return [
        {"input_ids": rows[i : i + 16], "labels": rows[i : i + 16]} for i in range(0, len(rows), 16)
    ]


def gpt2(n_positions: int) -> HuggingFaceModel:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=256,
        n_positions=n_positions,
        n_embd=128,
        n_layer=2,
        n_head=4,
        bos_token_id=10,
        eos_token_id=10,
    )
    config.loss_type = "ForCausalLM"
    return HuggingFaceModel(GPT2LMHeadModel(config))


@torch.no_grad()
def eval_loss(model: HuggingFaceModel, data: torch.Tensor, length: int) -> float:
    model.eval()
    losses = [float(model(batch).loss) for batch in windows(data, length)[:8]]
    return sum(losses) / len(losses)


def alibi_figure(steps: int) -> None:
    text = stdlib_bytes(1_200_000)
    train, held_out = text[:1_000_000], text[1_000_000:]
    results = {}
    for name, algorithms in (("learned positions", []), ("alibi", [Alibi()])):
        model = gpt2(n_positions=256)
        trainer = Trainer(
            model=model,
            train_dataloader=windows(train, 64),
            optimizers=torch.optim.AdamW(model.parameters(), lr=2e-3),
            max_duration=f"{steps}ba",
            algorithms=algorithms,
            progress_bar=False,
            device="cpu",
            seed=0,
        )
        trainer.fit()
        results[name] = [eval_loss(model, held_out, length) for length in (64, 128, 256)]
    print("ALiBi extrapolation (held-out loss, nats/byte; trained at length 64):")
    for name, losses in results.items():
        print(
            f"  {name:<18} "
            + "  ".join(
                f"L={n}: {loss:.3f}" for n, loss in zip((64, 128, 256), losses, strict=True)
            )
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


def step_time_figure(steps: int) -> None:
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
        trainer = Trainer(
            model=model,
            train_dataloader=DataLoader(TensorDataset(images, labels), batch_size=32),
            optimizers=torch.optim.SGD(model.parameters(), lr=0.05),
            max_duration=f"{steps}ba",
            algorithms=algorithms,
            progress_bar=False,
            device="cpu",
            seed=0,
        )
        trainer.fit(duration="5ba")  # warm-up outside the measurement
        start = time.perf_counter()
        trainer.fit(duration=f"{steps - 5}ba")  # to max_duration = steps
        assert trainer.state.timestamp.batch == steps
        seconds[name] = (time.perf_counter() - start) / (steps - 5)
    base = seconds["baseline"]
    print(f"Step time over a {steps}-batch run of a small CNN (32x32 images, batch 32):")
    for name, value in seconds.items():
        print(f"  {name:<21} {value * 1000:7.1f} ms/step  ratio {value / base:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lm-steps", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(2)
    alibi_figure(args.lm_steps)
    step_time_figure(args.steps)


if __name__ == "__main__":
    main()
