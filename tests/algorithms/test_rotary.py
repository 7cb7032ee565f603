"""rotary: GPT-2's learned positions replaced by rotary q and k, checked by hand."""

import math

import pytest
import torch
from torch import nn

from trainkit.algorithms import Rotary, RotaryGPT2Attention, apply_qk_norm, apply_rotary
from trainkit.core import Event, Logger, State

transformers = pytest.importorskip("transformers")

L, EMBED, HEADS = 5, 16, 2


def gpt2(attn_implementation="sdpa", **options):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_head=HEADS,
        n_embd=EMBED,
        vocab_size=32,
        n_positions=8,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        **options,
    )
    config._attn_implementation = attn_implementation
    return transformers.GPT2LMHeadModel(config).eval()


def rotated_by_hand(x, positions, base=10000.0):
    """Each pair (x[i], x[i + d/2]) of every head turned by position * base**(-2i/d)."""
    out = x.clone()
    d = x.shape[-1]
    for p, position in enumerate(positions):
        for i in range(d // 2):
            angle = position * base ** (-2 * i / d)
            c, s = math.cos(angle), math.sin(angle)
            a, b = x[..., p, i], x[..., p, i + d // 2]
            out[..., p, i], out[..., p, i + d // 2] = a * c - b * s, b * c + a * s
    return out


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_attention_equals_attention_of_rotated_queries_and_keys_by_hand(implementation):
    model = gpt2(implementation)
    names = {n for n, _ in model.named_parameters()}
    replaced = apply_rotary(model, base=500.0)
    assert sorted(replaced) == [
        "transformer.h.0.attn",
        "transformer.h.1.attn",
        "transformer.wpe",
    ]
    assert names - {n for n, _ in model.named_parameters()} == {"transformer.wpe.weight"}
    assert {n for n, _ in model.named_parameters()} <= names  # the others keep their names
    attn = model.transformer.h[0].attn
    assert isinstance(attn, RotaryGPT2Attention)
    x = torch.randn(2, L, EMBED)
    positions = [3, 4, 5, 6, 7]
    q, k, v = (
        t.unflatten(-1, (HEADS, -1)).transpose(1, 2)
        for t in (x @ attn.c_attn.weight + attn.c_attn.bias).split(EMBED, dim=-1)
    )
    q, k = rotated_by_hand(q, positions, 500.0), rotated_by_hand(k, positions, 500.0)
    scores = q @ k.transpose(-1, -2) / math.sqrt(EMBED // HEADS)
    future = torch.ones(L, L, dtype=torch.bool).triu(1)
    merged = (scores.masked_fill(future, -math.inf).softmax(-1) @ v).transpose(1, 2).flatten(-2)
    expected = merged @ attn.c_proj.weight + attn.c_proj.bias
    mask = torch.zeros(1, 1, L, L).masked_fill(future, torch.finfo(torch.float32).min)
    output = attn(x, attention_mask=mask, position_ids=torch.tensor([positions]))[0]
    torch.testing.assert_close(output, expected)


def test_logits_depend_on_relative_positions_only_and_run_past_n_positions():
    model = gpt2()
    apply_rotary(model)
    ids = torch.randint(0, 32, (1, L))
    start = model(input_ids=ids, position_ids=torch.arange(L)[None]).logits
    shifted = model(input_ids=ids, position_ids=torch.arange(L)[None] + 40).logits
    torch.testing.assert_close(start, shifted, atol=1e-5, rtol=1e-4)
    assert model(input_ids=torch.randint(0, 32, (1, 12))).logits.shape == (1, 12, 32)  # > 8


def test_generation_with_a_cache_gives_the_logits_of_the_whole_sequence():
    model = gpt2()
    apply_rotary(model)
    ids = torch.randint(0, 32, (1, 6))
    whole = model(input_ids=ids).logits
    first = model(input_ids=ids[:, :4], use_cache=True)
    rest = model(input_ids=ids[:, 4:], past_key_values=first.past_key_values).logits
    torch.testing.assert_close(torch.cat([first.logits, rest], dim=1), whole)


def test_trains_at_init_and_the_position_table_leaves_the_optimizer():
    model = gpt2().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = State(model=model, optimizers=[optimizer])
    Rotary().apply(Event.INIT, state, Logger([], state))
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert held == {id(p) for p in model.parameters()}
    ids = torch.randint(0, 32, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()


def test_composes_with_qk_norm():
    model = gpt2()
    apply_rotary(model)
    assert len(apply_qk_norm(model)) == 2  # qk_norm finds the rotary attention's c_attn
    ids = torch.randint(0, 32, (1, L))
    assert torch.isfinite(model(input_ids=ids).logits).all()


def test_refused_on_llama_twice_and_on_other_models():
    config = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=16,
    )
    with pytest.raises(ValueError, match="already applies rotary position embeddings"):
        apply_rotary(transformers.LlamaForCausalLM(config))
    model = gpt2()
    apply_rotary(model)
    with pytest.raises(ValueError, match="already applies rotary"):
        apply_rotary(model)
    with pytest.raises(ValueError, match="contains no GPT2Attention"):
        apply_rotary(nn.Sequential(nn.Linear(4, 4)))
    with pytest.raises(ValueError, match="reorder_and_upcast_attn=True"):
        apply_rotary(gpt2(reorder_and_upcast_attn=True))
    with pytest.raises(ValueError, match="base must be above 1, got 1"):
        Rotary(base=1)
