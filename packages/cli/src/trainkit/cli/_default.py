"""The embedded default run's pieces: a byte-level GPT-2 and Python source to train it on.

Every machine with Python has the standard library's source, so ``trainkit train`` with no
config trains a real language model out of the box, without downloading anything. The
held-out bytes come from whole files the model never trains on, and the compressors'
figures (`compressor_baselines`) are computed on exactly the bytes the model is scored on.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import logging
import lzma
import re
import sysconfig
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from trainkit.core import TrainModel, plugins

__all__ = [
    "HeldOutWindows",
    "byte_tokenizer",
    "compressor_baselines",
    "generate",
    "python_sources",
    "stdlib_text",
    "tiny_gpt2",
]

VOCAB = 256  # one token per byte
_CODEC_TABLE = re.compile(rb"^decoding_table = ", re.MULTILINE)
_SKIPPED_FOLDERS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}


def tiny_gpt2(
    n_layer: int = 2,
    n_head: int = 4,
    n_embd: int = 128,
    n_positions: int = 128,
    dropout: float = 0.0,
) -> TrainModel:
    """A randomly initialised GPT-2 over bytes (about 0.43M parameters by default), with a
    byte tokenizer (for `Generate`) and ``bits_per_byte`` among its eval metrics.

    ``dropout`` is 0 by default (transformers' GPT-2 uses 0.1): a model trained for
    minutes sees each byte about once and gains nothing from it.
    """
    with quiet_third_party_imports():  # transformers imports torchao, whose Enums torch logs
        from transformers import GPT2Config, GPT2LMHeadModel  # noqa: F401  (loads the model code)

    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        bos_token_id=None,  # no end token: a sample runs for all its bytes
        eos_token_id=None,
    )
    config.loss_type = "ForCausalLM"  # set after construction: the constructor drops it
    # trainkit-trainer's HuggingFaceModel and metrics, by entry point (the CLI imports only
    # core); one token is one byte, so bits per token is bits per byte.
    metrics = {
        "cross_entropy": plugins.load("trainkit.metrics", "cross_entropy")(),
        "bits_per_byte": plugins.load("trainkit.metrics", "bits_per_token")(),
    }
    from_config = plugins.load("trainkit.models", "huggingface")
    wrapped = from_config(config, tokenizer=byte_tokenizer(), eval_metrics=metrics)
    # transformers 5 reads the loss from the model, which takes it from its class name:
    # "GPT2LMHeadModel" names none, and every run would warn that the loss is unrecognised.
    wrapped.model.loss_type = "ForCausalLM"
    return wrapped


def byte_tokenizer() -> Any:
    """A transformers tokenizer whose token ids are the UTF-8 bytes (pad: byte 0)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # GPT-2's byte-level alphabet: printable bytes stand for themselves, the rest are
    # moved past 255, so every byte is one visible character of the vocabulary.
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    extra = iter(range(256, 512))
    chars = [chr(b) if b in printable else chr(next(extra)) for b in range(VOCAB)]
    tokenizer = Tokenizer(models.BPE(vocab={c: b for b, c in enumerate(chars)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=chars[0])


_PYTREE_ENUM_NOTICE = "is an Enum subclass and is now natively supported by torch.compile"
"""What torch logs (``torch.utils._pytree``, at WARNING) for each Enum torchao registers as a
pytree constant when transformers imports it: twice before the run's first line, about
torchao's code, with nothing for the user to do."""


class _DropPytreeEnumNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _PYTREE_ENUM_NOTICE not in record.getMessage()


@contextlib.contextmanager
def quiet_third_party_imports() -> Iterator[None]:
    """While importing transformers (and the torchao it imports): drop torch's deprecation
    notice about torchao's Enums, that notice only; every other record goes through."""
    logger, dropped = logging.getLogger("torch.utils._pytree"), _DropPytreeEnumNotice()
    logger.addFilter(dropped)
    try:
        yield
    finally:
        logger.removeFilter(dropped)


# --- data ----------------------------------------------------------------------------------


class ByteWindows(Dataset):
    """Non-overlapping windows of ``seq_len`` bytes; each is its own label (shifted by the model)."""

    def __init__(self, data: torch.Tensor, seq_len: int):
        self.data, self.seq_len = data, seq_len

    def __len__(self) -> int:
        return len(self.data) // self.seq_len

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        window = self.data[index * self.seq_len : (index + 1) * self.seq_len].long()
        return {"input_ids": window, "labels": window}


class HeldOutWindows(Dataset):
    """Windows of ``seq_len`` bytes every ``stride`` bytes over the held-out bytes, so that
    each byte after the first is scored exactly once, with at least ``seq_len - stride``
    bytes of context (labels already scored by the previous window are -100).

    `scored_bytes` are the bytes these windows cover: the ones to compare a compressor on.
    """

    def __init__(self, data: bytes, seq_len: int, stride: int):
        if not 1 <= stride <= seq_len - 1:
            raise ValueError(
                f"stride must be in [1, seq_len - 1], got {stride} (seq_len {seq_len})"
            )
        if len(data) < seq_len:
            raise ValueError(f"{len(data)} held-out bytes are fewer than seq_len {seq_len}")
        self.data = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        self.seq_len = seq_len
        self.starts = list(range(0, len(data) - seq_len + 1, stride))
        if self.starts[-1] + seq_len < len(data):
            self.starts.append(len(data) - seq_len)

    def scored_bytes(self) -> bytes:
        return bytes(self.data.numpy())

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start = self.starts[index]
        window = self.data[start : start + self.seq_len].long()
        labels = window.clone()
        if index > 0:  # positions the previous window already scored
            labels[: self.starts[index - 1] + self.seq_len - start] = -100
        return {"input_ids": window, "labels": labels}


def python_sources(
    eval_bytes: int, max_bytes: int | None = None, site_packages: bool = False
) -> tuple[bytes, bytes, int]:
    """``(train, held_out, held_out_files)``: Python source, split by whole files.

    The standard library's ``.py`` files (tests excluded) are ordered by a hash of their
    path; the first make up ``eval_bytes`` of held-out text (the last one cut), the rest
    the training text, followed with ``site_packages`` by those of the installed packages
    (also in hash order), up to ``max_bytes``. A training file with the same content as a
    held-out one is left out, so no held-out byte is trained on. Character-mapping codec
    tables (the ~70 ``encodings`` modules defining a 256-entry ``decoding_table``, 1.2 MB of
    generated hex tables) are left out of both: they are data, not Python as people write it.
    """
    paths = sysconfig.get_paths()
    stdlib = _sources(Path(paths["stdlib"]), _SKIPPED_FOLDERS)
    held_out, seen, taken = [], set(), 0
    while stdlib and taken < eval_bytes:
        text = stdlib.pop(0).read_bytes()
        if _CODEC_TABLE.search(text):
            continue
        held_out.append(text)
        seen.add(hashlib.sha1(text).digest())
        taken += len(text)
    if taken < eval_bytes or not stdlib:
        raise ValueError(
            f"found {taken} bytes of Python source under {paths['stdlib']}; eval_bytes="
            f"{eval_bytes} must leave some for training"
        )
    if site_packages:
        stdlib += _sources(Path(paths["purelib"]), _SKIPPED_FOLDERS - {"site-packages"})
    train, size = [], 0
    for path in stdlib:
        if max_bytes is not None and size >= max_bytes:
            break
        text = path.read_bytes()
        if hashlib.sha1(text).digest() not in seen and not _CODEC_TABLE.search(text):
            train.append(text)
            size += len(text)
    return b"".join(train)[:max_bytes], b"".join(held_out)[:eval_bytes], len(held_out)


def _sources(root: Path, skipped: set[str]) -> list[Path]:
    """The ``.py`` files under ``root`` outside ``skipped`` folders, in hash order."""
    found = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root).as_posix()
        if not skipped & set(relative.split("/")[:-1]):
            found.append((zlib.crc32(relative.encode()), relative, path))
    return [path for _, _, path in sorted(found)]


def stdlib_text(
    seq_len: int = 128,
    batch_size: int = 16,
    max_bytes: int | None = None,
    eval_bytes: int = 131_072,
    eval_batch_size: int = 64,
    eval_stride: int | None = None,
    site_packages: bool = False,
) -> dict[str, DataLoader]:
    """Train / eval loaders over the standard library's ``.py`` files (`python_sources`).

    The eval loader's windows (`HeldOutWindows`, every ``eval_stride`` bytes, default
    ``seq_len // 2``) score each held-out byte once. ``max_bytes`` limits the training
    text (None: all of it).
    """
    if seq_len < 2 or batch_size < 1:
        raise ValueError(
            f"seq_len must be >= 2 and batch_size >= 1, got {seq_len} and {batch_size}"
        )
    train, held_out, _ = python_sources(eval_bytes, max_bytes, site_packages)
    data = torch.frombuffer(bytearray(train), dtype=torch.uint8)
    stride = eval_stride if eval_stride is not None else max(1, seq_len // 2)
    return {
        "train": DataLoader(
            ByteWindows(data, seq_len), batch_size=batch_size, shuffle=True, drop_last=True
        ),
        "eval": DataLoader(HeldOutWindows(held_out, seq_len, stride), batch_size=eval_batch_size),
    }


def compressor_baselines(data: bytes) -> dict[str, float]:
    """Bits per byte of ``gzip -9`` and ``xz -9`` on ``data`` (Python's gzip and lzma)."""
    if not data:
        raise ValueError("no bytes to compress")
    bits = 8 / len(data)
    return {
        "gzip -9": len(gzip.compress(data, compresslevel=9, mtime=0)) * bits,
        "xz -9": len(lzma.compress(data, preset=9)) * bits,
    }


@torch.no_grad()
def generate(
    model: Any, prompt: str = "def ", length: int = 200, temperature: float = 0.8, seed: int = 0
) -> str:
    """Sample ``length`` bytes after ``prompt`` from a byte-level causal LM (for runs
    without trainkit-loggers' `Generate` callback)."""
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
