"""The embedded default run: a small byte-level GPT-2 on the Python standard library's source.

Every machine with Python has this text, so ``trainkit train`` with no config trains a
real language model out of the box, without downloading anything.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from trainkit.core import HuggingFaceModel

__all__ = ["generate", "stdlib_text", "tiny_gpt2"]

VOCAB = 256  # one token per byte


def tiny_gpt2(
    n_layer: int = 2, n_head: int = 4, n_embd: int = 128, n_positions: int = 128
) -> HuggingFaceModel:
    """A randomly initialised GPT-2 over bytes (about 0.45M parameters by default)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        bos_token_id=ord("\n"),
        eos_token_id=ord("\n"),
    )
    config.loss_type = "ForCausalLM"  # set after construction: the constructor drops it
    return HuggingFaceModel(GPT2LMHeadModel(config))


class ByteWindows(Dataset):
    """Non-overlapping windows of ``seq_len`` bytes; each is its own label (shifted by the model)."""

    def __init__(self, data: torch.Tensor, seq_len: int):
        self.data, self.seq_len = data, seq_len

    def __len__(self) -> int:
        return len(self.data) // self.seq_len

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        window = self.data[index * self.seq_len : (index + 1) * self.seq_len].long()
        return {"input_ids": window, "labels": window}


def stdlib_text(
    seq_len: int = 128,
    batch_size: int = 16,
    max_bytes: int = 4_000_000,
    eval_bytes: int = 131_072,
    eval_batch_size: int = 64,
) -> dict[str, DataLoader]:
    """Train / eval loaders over the standard library's ``.py`` files, read in a fixed order.

    The last ``eval_bytes`` are held out (they come from files the model never trains on).
    """
    if seq_len < 2 or batch_size < 1:
        raise ValueError(
            f"seq_len must be >= 2 and batch_size >= 1, got {seq_len} and {batch_size}"
        )
    text = _read_stdlib(max_bytes + eval_bytes)
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    train, held_out = data[:-eval_bytes], data[-eval_bytes:]
    return {
        "train": DataLoader(
            ByteWindows(train, seq_len), batch_size=batch_size, shuffle=True, drop_last=True
        ),
        "eval": DataLoader(ByteWindows(held_out, seq_len), batch_size=eval_batch_size),
    }


def _read_stdlib(limit: int) -> bytes:
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, size = [], 0
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        if "test" in path.parts or size >= limit:
            continue
        chunk = path.read_bytes()
        chunks.append(chunk)
        size += len(chunk)
    if size < limit:
        raise ValueError(f"found only {size} bytes of Python source under {root}; lower max_bytes")
    return b"".join(chunks)[:limit]


@torch.no_grad()
def generate(
    model: Any, prompt: str = "def ", length: int = 200, temperature: float = 0.8, seed: int = 0
) -> str:
    """Sample ``length`` bytes after ``prompt`` from a byte-level causal LM."""
    inner = getattr(model, "model", model)
    device = next(inner.parameters()).device
    context = getattr(inner.config, "n_positions", 128)
    ids = torch.tensor([list(prompt.encode())], device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    was_training = inner.training
    inner.eval()
    for _ in range(length):
        logits = inner(input_ids=ids[:, -context:]).logits[0, -1].float() / temperature
        next_id = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
        ids = torch.cat([ids, next_id[None]], dim=1)
    inner.train(was_training)
    return bytes(ids[0].tolist()).decode("utf-8", errors="replace")
