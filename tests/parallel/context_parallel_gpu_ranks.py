"""The training that test_context_parallel_gpu.py runs on each spawned rank and alone.

A module of its own, not the test file: ``spawn`` starts each rank in a new interpreter,
which imports the function it runs by its module's name.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from parallel.helpers import LossLog, Tokens, full_weights
from trainkit.parallel import FSDP, ContextParallel
from trainkit.trainer import HuggingFaceModel, Trainer

LENGTH = 64
SAMPLES = 32


def llama() -> HuggingFaceModel:
    """A small Llama on SDPA (no grouped-query attention), sequences of `LENGTH`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=4, vocab_size=64, max_position_embeddings=LENGTH,
        attn_implementation="sdpa",
    )  # fmt: skip
    return HuggingFaceModel(LlamaForCausalLM(config))


def fit(strategy: FSDP | None, device: str = "cuda") -> tuple[Trainer, list[float]]:
    """4 batches of 8 sequences; every rank reads the whole batch (one context group)."""
    model, losses = llama(), LossLog()
    trainer = Trainer(
        model=model,
        train_dataloader=DataLoader(Tokens(samples=SAMPLES, length=LENGTH), batch_size=8),
        max_duration="4ba",
        optimizers=torch.optim.SGD(model.parameters(), lr=0.05),
        parallelism=strategy,
        device=device,
        callbacks=[losses],
        progress_bar=False,
        seed=7,
    )
    trainer.fit()
    return trainer, losses.losses


def context_parallel_rank(
    rank: int, world: int, port: int, folder: str, backend: str = "nccl"
) -> None:
    """Join the store at ``port``, train with context parallel over ``world`` ranks, and
    save rank 0's losses, weights and counts in ``folder``."""
    device = "cuda" if backend == "nccl" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(rank)
    timeout = datetime.timedelta(seconds=120)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timeout)
    dist.init_process_group(
        backend, store=dist.PrefixStore("cp", store), rank=rank, world_size=world, timeout=timeout
    )
    try:
        trainer, losses = fit(FSDP(context_parallel=ContextParallel(degree=world)), device)
        weights = full_weights(trainer.state.model)  # collective
        counted = (int(trainer.state.timestamp.sample), int(trainer.state.timestamp.token))
        if rank == 0:
            torch.save(
                {"losses": losses, "weights": weights, "counted": counted},
                Path(folder) / "context_parallel.pt",
            )
    finally:
        dist.destroy_process_group()
