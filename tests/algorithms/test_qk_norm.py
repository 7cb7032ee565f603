"""qk_norm: queries and keys RMS-normalised per head, with learned gains, in GPT-2 and Llama."""

import pytest
import torch
from torch import nn

from trainkit.algorithms import QKNorm, QKNormConv1D, QKNormLinear, apply_qk_norm
from trainkit.core import Event, Logger, State

transformers = pytest.importorskip("transformers")

L, EMBED = 6, 16


def gpt2(attn_implementation="sdpa"):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=EMBED, vocab_size=32, n_positions=16, attn_pdrop=0.0
    )
    config._attn_implementation = attn_implementation
    return transformers.GPT2LMHeadModel(config).eval()


def llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=EMBED,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
    )
    return transformers.LlamaForCausalLM(config).eval()


def rms_per_head(x, gain, eps=1e-6):
    """(N, heads, L, head_dim) normalised over head_dim by hand."""
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


def causal_attention(q, k, v):
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    future = torch.ones(L, L, dtype=torch.bool).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1) @ v


def causal_mask():
    return torch.zeros(1, 1, L, L).masked_fill(
        torch.ones(L, L, dtype=torch.bool).triu(1), torch.finfo(torch.float32).min
    )


def randomize_gains(model):
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight") and "attn" in name:
                parameter.uniform_(0.5, 2.0)


def heads(x, n):
    return x.unflatten(-1, (n, -1)).transpose(1, 2)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_gpt2_attention_equals_attention_of_normalised_queries_and_keys_by_hand(implementation):
    model = gpt2(implementation)
    names_before = {n for n, _ in model.named_parameters()}
    weight = model.transformer.h[0].attn.c_attn.weight
    replaced = apply_qk_norm(model)
    assert sorted(replaced) == ["transformer.h.0.attn.c_attn", "transformer.h.1.attn.c_attn"]
    new = {n for n, _ in model.named_parameters()} - names_before
    assert new == {f"transformer.h.{i}.attn.c_attn.{q}_norm.weight" for i in (0, 1) for q in "qk"}
    attn = model.transformer.h[0].attn
    assert isinstance(attn.c_attn, QKNormConv1D) and attn.c_attn.weight is weight
    randomize_gains(model)
    x = torch.randn(2, L, EMBED)
    q, k, v = (x @ attn.c_attn.weight + attn.c_attn.bias).split(EMBED, dim=-1)
    q = rms_per_head(heads(q, 2), attn.c_attn.q_norm.weight)
    k = rms_per_head(heads(k, 2), attn.c_attn.k_norm.weight)
    merged = causal_attention(q, k, heads(v, 2)).transpose(1, 2).flatten(-2)
    expected = merged @ attn.c_proj.weight + attn.c_proj.bias
    torch.testing.assert_close(attn(x, attention_mask=causal_mask())[0], expected)


def test_llama_attention_normalises_before_its_rotary_embedding_by_hand():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = llama()
    replaced = apply_qk_norm(model, eps=1e-5)
    assert len(replaced) == 4  # q_proj and k_proj of both layers
    attn = model.model.layers[1].self_attn
    assert isinstance(attn.q_proj, QKNormLinear) and isinstance(attn.k_proj, QKNormLinear)
    assert attn.q_proj.norm.weight.shape == attn.k_proj.norm.weight.shape == (4,)
    randomize_gains(model)
    x = torch.randn(2, L, EMBED)
    cos, sin = model.model.rotary_emb(x, torch.arange(L)[None])
    q = rms_per_head(heads(x @ attn.q_proj.weight.T, 4), attn.q_proj.norm.weight, 1e-5)
    k = rms_per_head(heads(x @ attn.k_proj.weight.T, 2), attn.k_proj.norm.weight, 1e-5)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    v = heads(x @ attn.v_proj.weight.T, 2)
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)  # 4 heads share 2
    expected = causal_attention(q, k, v).transpose(1, 2).flatten(-2) @ attn.o_proj.weight.T
    output = attn(x, position_embeddings=(cos, sin), attention_mask=causal_mask())[0]
    torch.testing.assert_close(output, expected)


def test_gains_train_and_join_the_optimizer_at_init():
    model = gpt2().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = State(model=model, optimizers=[optimizer])
    QKNorm().apply(Event.INIT, state, Logger([], state))
    gain = model.transformer.h[0].attn.c_attn.q_norm.weight
    assert any(p is gain for p in optimizer.param_groups[0]["params"])
    ids = torch.randint(0, 32, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    assert not torch.equal(gain, torch.ones_like(gain))


def test_a_checkpoint_with_qk_norm_does_not_load_into_a_plain_model():
    model = gpt2()
    apply_qk_norm(model)
    with pytest.raises(RuntimeError, match=r"c_attn\.q_norm\.weight"):
        gpt2().load_state_dict(model.state_dict())


def test_refused_twice_or_on_models_it_cannot_apply_to():
    model = gpt2()
    apply_qk_norm(model)
    with pytest.raises(ValueError, match="already normalises its queries and keys"):
        apply_qk_norm(model)
    with pytest.raises(ValueError, match="found no attention it applies to in Sequential"):
        apply_qk_norm(nn.Sequential(nn.Linear(4, 4)))
    with pytest.raises(ValueError, match="eps must be positive, got 0"):
        QKNorm(eps=0)


def test_a_model_that_already_normalises_queries_and_keys_is_refused():
    config = transformers.Qwen3Config(
        vocab_size=32,
        hidden_size=EMBED,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
    )
    with pytest.raises(ValueError, match=r"self_attn \(Qwen3Attention\) already normalises"):
        apply_qk_norm(transformers.Qwen3ForCausalLM(config))
