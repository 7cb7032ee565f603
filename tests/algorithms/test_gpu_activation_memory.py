"""ActivationCheckpointing on a CUDA device: what each mode saves in device memory (run with
`uv run pytest -m gpu`; skipped without a GPU). The CPU tests check the gradients and where
the work goes (tests/algorithms/test_activation_checkpointing.py)."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainkit.algorithms import apply_activation_checkpointing

pytestmark = pytest.mark.gpu


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


def activation_bytes(mode):
    """Device memory held between the forward and the backward, beyond the model's."""
    torch.manual_seed(0)
    model = nn.Sequential(*(Block(1024) for _ in range(8))).cuda()
    if mode is not None:
        wrapper = nn.Module()
        wrapper.blocks = nn.ModuleList(model)
        apply_activation_checkpointing(wrapper, mode)
    x = torch.randn(16, 512, 1024, device="cuda", requires_grad=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    loss = model(x).float().pow(2).mean()
    held = torch.cuda.memory_allocated() - before
    loss.backward()
    return held


def test_each_mode_holds_less_device_memory_than_none():
    none, full, selective, offload = (
        activation_bytes(mode) for mode in (None, "full", "selective", "offload")
    )
    # Full keeps each block's input (1/8 of an MLP block's ~11 saved tensors' worth);
    # selective keeps the two matmul outputs (the widest one 4x the input); offload keeps
    # nothing on the device but the output.
    assert full < 0.2 * none
    assert full < selective < 0.8 * none
    assert offload < 0.2 * none
