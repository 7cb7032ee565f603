"""relu_squared: GPT-2's and Llama's MLP activation becomes relu(x)**2 (Primer)."""

import pytest
import torch
from torch import nn

from trainkit.algorithms import ReLUSquared, SquaredReLU, apply_relu_squared
from trainkit.core import Event, Logger, State

transformers = pytest.importorskip("transformers")


def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=16, vocab_size=32, n_positions=16, resid_pdrop=0.0
    )
    return transformers.GPT2LMHeadModel(config).eval()


def llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
    )
    return transformers.LlamaForCausalLM(config).eval()


def test_gpt2_mlp_computes_c_proj_of_squared_relu_by_hand():
    model = gpt2()
    replaced = apply_relu_squared(model)
    assert sorted(replaced) == ["transformer.h.0.mlp.act", "transformer.h.1.mlp.act"]
    mlp = model.transformer.h[1].mlp
    x = torch.randn(2, 5, 16)
    hidden = x @ mlp.c_fc.weight + mlp.c_fc.bias
    expected = torch.clamp(hidden, min=0) ** 2 @ mlp.c_proj.weight + mlp.c_proj.bias
    torch.testing.assert_close(mlp(x), expected)


def test_llama_gated_mlp_keeps_its_gate_and_squares_the_relu_of_it():
    model = llama()
    names = [n for n, _ in model.named_parameters()]
    replaced = apply_relu_squared(model)
    assert sorted(replaced) == ["model.layers.0.mlp.act_fn", "model.layers.1.mlp.act_fn"]
    assert [n for n, _ in model.named_parameters()] == names
    mlp = model.model.layers[0].mlp
    x = torch.randn(2, 5, 16)
    gate = torch.clamp(x @ mlp.gate_proj.weight.T, min=0) ** 2
    expected = (gate * (x @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T
    torch.testing.assert_close(mlp(x), expected)


def test_the_whole_model_changes_and_still_trains():
    model = gpt2().train()
    ids = torch.randint(0, 32, (2, 8))
    before = model(input_ids=ids).logits
    state = State(model=model)
    ReLUSquared().apply(Event.INIT, state, Logger([], state))
    after = model(input_ids=ids, labels=ids)
    assert not torch.allclose(before, after.logits)
    after.loss.backward()
    assert model.transformer.h[0].mlp.c_fc.weight.grad.abs().sum() > 0


def test_a_model_without_a_gpt2_or_llama_mlp_is_refused_by_name():
    with pytest.raises(ValueError, match="relu_squared found no MLP it applies to in Sequential"):
        apply_relu_squared(nn.Sequential(nn.Linear(4, 4), nn.GELU()))


def test_squared_relu_is_relu_squared_elementwise():
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 3.0])
    torch.testing.assert_close(SquaredReLU()(x), torch.tensor([0.0, 0.0, 0.0, 0.25, 9.0]))
