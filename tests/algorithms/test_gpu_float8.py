"""Float8Training on a CUDA device (run with `uv run pytest -m gpu`; skipped without a GPU).

On a GPU of compute capability 8.9+ (Ada, Hopper) a small Llama trains with fp8 matmuls
under bf16 autocast, eager and compiled, close to the same run in bf16; on an older GPU
the algorithm refuses with the GPU's name. tests/algorithms/test_float8_training.py
covers the rest on CPU.
"""

import math
import re

import pytest
import torch
from torch.utils.data import DataLoader
from torchao.float8.float8_linear import Float8Linear

from parallel.helpers import Tokens
from trainkit.algorithms import Float8Training
from trainkit.core import Callback
from trainkit.trainer import HuggingFaceModel, Trainer

pytestmark = pytest.mark.gpu


def capability():
    return torch.cuda.get_device_capability(0)


def needs_fp8():
    if capability() < (8, 9):
        pytest.skip(f"fp8 needs SM 8.9+; {torch.cuda.get_device_name(0)} is SM {capability()}")


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=2, hidden_size=256, intermediate_size=512, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=512, max_position_embeddings=64,
    )  # fmt: skip
    return HuggingFaceModel(LlamaForCausalLM(config))


class Losses(Callback):
    def __init__(self):
        self.losses = []

    def after_loss(self, state, logger):
        self.losses.append(float(state.loss.detach()))


def fit(algorithms=(), device="cuda", batches=8, **kwargs):
    model = llama()
    losses = Losses()
    trainer = Trainer(
        model=model,
        optimizers=torch.optim.AdamW(model.parameters(), lr=3e-3),
        train_dataloader=DataLoader(Tokens(samples=16, length=64, vocab=512), batch_size=8),
        max_duration=f"{batches}ba",
        precision="amp_bf16",
        algorithms=list(algorithms),
        device=device,
        callbacks=[losses],
        progress_bar=False,
        seed=0,
        **kwargs,
    )
    trainer.fit()
    return model, losses.losses


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_float8_trains_close_to_bf16(compiled):
    needs_fp8()
    options = {"compile": True} if compiled else {}
    model, fp8 = fit([Float8Training()], **options)
    layers = model.model.model.layers
    assert isinstance(layers[0].mlp.down_proj, Float8Linear)
    assert isinstance(layers[0].self_attn.q_proj, Float8Linear)
    assert not isinstance(model.model.lm_head, Float8Linear)  # the head stays high precision
    _, bf16 = fit(**options)
    assert all(math.isfinite(loss) for loss in fp8)
    assert fp8 != bf16  # fp8 matmuls ran
    torch.testing.assert_close(fp8, bf16, rtol=0.05, atol=0.05)
    assert fp8[-1] < fp8[0]


def test_rowwise_recipe_trains():
    needs_fp8()
    _, losses = fit([Float8Training(recipe="rowwise")])
    assert all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]


def test_an_older_gpu_is_refused_by_name():
    if capability() >= (8, 9):
        pytest.skip(f"{torch.cuda.get_device_name(0)} (SM {capability()}) has fp8 tensor cores")
    with pytest.raises(RuntimeError, match=re.escape(torch.cuda.get_device_name(0))) as err:
        fit([Float8Training()], batches=1)
    assert "SM 8.9+" in str(err.value) and "amp_bf16" in str(err.value)
