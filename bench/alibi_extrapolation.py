"""ALiBi extrapolation: a 12-head GPT-2 trained at length L, evaluated at L, 2L and 4L.

Two byte-level GPT-2s (12 heads, random init, same seed) train on the Python standard
library's source, bytes as tokens, on exactly the same token batches:

- **alibi**: `Alibi(max_sequence_length=4L, train_sequence_length_scaling=0.25)`, fed
  windows of 4L that the algorithm reshapes into four times as many windows of L (as
  Composer does);
- **learned positions** (the baseline): the unchanged model with ``n_positions=4L`` so that
  it can run at 2L and 4L at all, fed the same windows of L. Its position embeddings at
  L and beyond are never trained (they keep their random init): that is what learned
  positions offer past the trained length. (With ``n_positions=L`` it could only be
  evaluated at L, where its figure is the one printed.)

Both are evaluated on the same held-out bytes, cut into windows of L, 2L and 4L; the loss
is the mean over every predicted byte (nats/byte). Figures are ratios to the loss at L, so
< 1 means longer context helped and > 1 that the model fell apart beyond L. The ALiBi
paper's claim (and the target): loss at 2L and 4L no worse than at L.

    uv run python bench/alibi_extrapolation.py [--steps 500] [--length 64] [--threads 1]

Step time is CPU time per training step (one thread by default: on a shared 2-core machine
two OpenMP threads spin-wait and make wall time meaningless for a model this small). About
100 s of CPU in all.

`alibi_extrapolation()` returns the figures as a dict, for bench/algorithms.py.
"""

from __future__ import annotations

import argparse
import sysconfig
import time
from pathlib import Path
from typing import Any

import torch

from trainkit.algorithms.alibi import Alibi, scale_sequence_length
from trainkit.trainer import HuggingFaceModel, Trainer

HEADS, WIDTH, LAYERS = 12, 96, 2
TRAIN_BYTES, HELD_OUT_BYTES, ROWS = 2_000_000, 32_768, 16


def stdlib_bytes() -> torch.Tensor:
    root = Path(sysconfig.get_paths()["stdlib"])
    data = bytearray()
    for path in sorted(root.glob("*.py")):
        data += path.read_bytes()
        if len(data) >= TRAIN_BYTES + HELD_OUT_BYTES:
            break
    return torch.frombuffer(data, dtype=torch.uint8)[: TRAIN_BYTES + HELD_OUT_BYTES].long()


def windows(data: torch.Tensor, length: int) -> torch.Tensor:
    return data[: len(data) // length * length].view(-1, length)


def batches(data: torch.Tensor, length: int, rows: int, steps: int) -> list[dict[str, Any]]:
    rows_of = windows(data, length)
    out = [rows_of[i * rows : (i + 1) * rows] for i in range(steps)]
    if len(out[-1]) < rows:
        raise ValueError(f"{steps} steps of {rows} x {length} bytes need more training text")
    return [{"input_ids": b, "labels": b} for b in out]


def gpt2(n_positions: int) -> HuggingFaceModel:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=256, n_positions=n_positions, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS,
        bos_token_id=10, eos_token_id=10, loss_type="ForCausalLM",
    )  # fmt: skip
    return HuggingFaceModel(GPT2LMHeadModel(config))


@torch.no_grad()
def held_out_loss(model: HuggingFaceModel, data: torch.Tensor, length: int) -> float:
    """Mean loss over every predicted byte of ``data``, in windows of ``length``."""
    model.eval()
    total, count = 0.0, 0
    for rows in windows(data, length).split(16):
        loss = model({"input_ids": rows, "labels": rows}).loss
        predicted = rows.shape[0] * (length - 1)
        total, count = total + float(loss) * predicted, count + predicted
    return total / count


def train(model: HuggingFaceModel, data: list[dict[str, Any]], algorithms: list[Any]) -> float:
    trainer = Trainer(
        model=model,
        train_dataloader=data,
        optimizers=torch.optim.AdamW(model.parameters(), lr=3e-3),
        max_duration=f"{len(data)}ba",
        algorithms=algorithms,
        progress_bar=False,
        device="cpu",
        seed=0,
    )
    start = time.process_time()
    trainer.fit()
    return (time.process_time() - start) / len(data)


def alibi_extrapolation(steps: int = 500, length: int = 64) -> dict[str, Any]:
    """Held-out losses at L, 2L, 4L for ALiBi and learned positions, and their ratios."""
    text = stdlib_bytes()
    train_text, held_out = text[:TRAIN_BYTES], text[TRAIN_BYTES:]
    lengths = {"L": length, "2L": 2 * length, "4L": 4 * length}
    short = batches(train_text, length, ROWS, steps)
    long = batches(train_text, 4 * length, ROWS // 4, steps)
    # What the alibi run trains on, once reshaped, is exactly the baseline's batches.
    assert torch.equal(scale_sequence_length(long[0], 0.25)["input_ids"], short[0]["input_ids"])
    runs = {
        "alibi": (
            gpt2(n_positions=length), long,
            [Alibi(max_sequence_length=4 * length, train_sequence_length_scaling=0.25)],
        ),
        "learned_positions": (gpt2(n_positions=4 * length), short, []),
    }  # fmt: skip
    figures: dict[str, Any] = {"length": length, "steps": steps, "heads": HEADS}
    for name, (model, data, algorithms) in runs.items():
        seconds = train(model, data, algorithms)
        losses = {key: held_out_loss(model, held_out, n) for key, n in lengths.items()}
        figures[name] = {
            "loss": losses,
            "ratio": {key: losses[key] / losses["L"] for key in ("2L", "4L")},
            "cpu_seconds_per_step": seconds,
        }
    figures["alibi_vs_learned_at_L"] = (
        figures["alibi"]["loss"]["L"] / figures["learned_positions"]["loss"]["L"]
    )
    figures["step_time_ratio"] = (
        figures["alibi"]["cpu_seconds_per_step"]
        / figures["learned_positions"]["cpu_seconds_per_step"]
    )
    return figures


def report(figures: dict[str, Any]) -> None:
    n = figures["length"]
    print(
        f"ALiBi extrapolation: {HEADS}-head GPT-2 ({LAYERS} layers, width {WIDTH}), bytes of "
        f"the Python stdlib, {figures['steps']} steps of {ROWS} x {n} bytes, trained at L={n}; "
        "held-out loss in nats/byte"
    )
    print(f"  {'':<34}{'L':>8}{'2L':>8}{'4L':>8}{'2L/L':>8}{'4L/L':>8}{'cpu ms/step':>13}")
    labels = {
        "alibi": "alibi (trained at L via scaling)",
        "learned_positions": "learned positions (n_positions=4L)",
    }
    for name, label in labels.items():
        run = figures[name]
        losses = "".join(f"{run['loss'][k]:8.3f}" for k in ("L", "2L", "4L"))
        ratios = "".join(f"{run['ratio'][k]:8.4f}" for k in ("2L", "4L"))
        print(f"  {label:<34}{losses}{ratios}{run['cpu_seconds_per_step'] * 1000:13.1f}")
    print("  (learned positions: positions >= L are untrained; at n_positions=L it runs at L only)")
    print(
        f"  alibi/learned at L: {figures['alibi_vs_learned_at_L']:.3f}; "
        f"CPU time per step alibi/learned: {figures['step_time_ratio']:.2f}"
    )
    alibi = figures["alibi"]["ratio"]
    print(
        f"summary: alibi loss 2L/L = {alibi['2L']:.3f}, 4L/L = {alibi['4L']:.3f} (target <= 1.00); "
        f"learned positions 4L/L = {figures['learned_positions']['ratio']['4L']:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    report(alibi_extrapolation(args.steps, args.length))


if __name__ == "__main__":
    main()
