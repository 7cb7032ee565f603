"""alibi: a GPT-2 trained at length L evaluates at 4L; BERT too; wrong models fail clearly."""

import math
import sys

import pytest
import torch
from torch import nn

from trainkit.algorithms import (
    Alibi,
    AlibiAttention,
    AlibiConfig,
    ZeroPositionEmbedding,
    alibi_bias,
    alibi_slopes,
    apply_alibi,
)
from trainkit.core import HuggingFaceModel, Trainer, plugins

transformers = pytest.importorskip("transformers")

VOCAB, PERIOD, L = 32, 16, 16


def gpt2(n_head=2, n_embd=32, **kwargs):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_head=n_head, n_embd=n_embd, vocab_size=VOCAB, n_positions=L,
        bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM", **kwargs,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=L,
    )  # fmt: skip
    return transformers.BertModel(config).eval()


def counting(batch_size, length, seed):
    generator = torch.Generator().manual_seed(seed)
    start = torch.randint(0, PERIOD, (batch_size, 1), generator=generator)
    ids = (start + torch.arange(length)) % PERIOD
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


@torch.no_grad()
def loss_at(model, length):
    model.eval()
    return model(**counting(16, length, seed=99)).loss.item()


def test_gpt2_trained_at_length_l_evaluates_at_4l():
    model = gpt2()
    trainer = Trainer(
        model=HuggingFaceModel(model),
        train_dataloader=[counting(8, L, seed) for seed in range(40)],
        optimizers=torch.optim.AdamW(model.parameters(), lr=3e-3),
        max_duration="40ba",
        algorithms=[Alibi(max_sequence_length=4 * L)],
        progress_bar=False,
        device="cpu",
    )
    assert isinstance(model.transformer.wpe, ZeroPositionEmbedding)
    assert all(isinstance(block.attn, AlibiAttention) for block in model.transformer.h)
    trainer.fit()
    at_l, at_4l = loss_at(model, L), loss_at(model, 4 * L)
    assert at_l < 0.5 * math.log(VOCAB)  # it learned the task
    assert at_4l < 1.5 * at_l + 0.05  # ... and it still holds at four times the length
    # With learned position embeddings the same model cannot even run at 4L.
    with pytest.raises(IndexError):
        gpt2().eval()(**counting(2, 4 * L, seed=0))


def test_causal_prefix_and_kv_cache_agree_with_the_full_sequence():
    model = gpt2().eval()
    apply_alibi(model, max_sequence_length=64)
    ids = counting(2, 40, seed=1)["input_ids"]
    with torch.no_grad():
        full = model(input_ids=ids).logits
        torch.testing.assert_close(model(input_ids=ids[:, :10]).logits, full[:, :10])
        generated = model.generate(
            ids[:, :5], attention_mask=torch.ones_like(ids[:, :5]), max_new_tokens=4,
            do_sample=False,
        )  # fmt: skip
        greedy = model(input_ids=generated[:, :-1]).logits.argmax(-1)[:, 4:]
    assert torch.equal(greedy, generated[:, 5:])


def test_slopes_and_bias():
    torch.testing.assert_close(alibi_slopes(8), 2.0 ** -torch.arange(1.0, 9.0))
    causal = alibi_bias(torch.tensor([0.5]), 2, 3, causal=True)[0]  # queries at positions 1, 2
    assert causal[0].tolist() == [-0.5, 0.0, -math.inf]
    assert causal[1].tolist() == [-1.0, -0.5, 0.0]
    both = alibi_bias(torch.tensor([0.5]), 3, 3, causal=False)[0]
    assert both[0].tolist() == [0.0, -0.5, -1.0] and torch.equal(both, both.T)


def test_bert_is_bidirectional_and_accepts_4l():
    model = bert()
    optimizer = torch.optim.AdamW(model.parameters())
    replaced = apply_alibi(model, max_sequence_length=4 * L, optimizers=optimizer)
    assert sorted(replaced) == [
        "embeddings.position_embeddings",
        "encoder.layer.0.attention.self",
        "encoder.layer.1.attention.self",
    ]
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for p in model.parameters()}  # the position table left both
    ids = torch.randint(0, VOCAB, (2, 4 * L))
    with torch.no_grad():
        out = model(input_ids=ids).last_hidden_state
        changed = ids.clone()
        changed[:, -1] = (changed[:, -1] + 1) % VOCAB
        first = model(input_ids=changed).last_hidden_state[:, 0]
    assert out.shape == (2, 4 * L, 16)
    assert not torch.allclose(first, out[:, 0])  # the first token sees the last one


def test_refuses_models_it_does_not_fit():
    with pytest.raises(ValueError, match="supports Hugging Face GPT-2 and BERT"):
        apply_alibi(nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"power of two.*got 3"):
        apply_alibi(gpt2(n_head=3, n_embd=24))
    model = gpt2()
    model.transformer.wpe = nn.Identity()
    with pytest.raises(ValueError, match="no learned position embedding `wpe`"):
        apply_alibi(model)
    model = gpt2()
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="'flash_attention_2' attention implementation"):
        apply_alibi(model)
    with pytest.raises(ValueError, match="needs 128 GiB; use a max_sequence_length of at most"):
        apply_alibi(gpt2(), max_sequence_length=2**17)


def test_refuses_after_training_started():
    model = gpt2()
    optimizer = torch.optim.Adam(model.parameters())
    model(**counting(2, 8, seed=0)).loss.backward()
    optimizer.step()
    with pytest.raises(ValueError, match="already holds state"):
        apply_alibi(model, optimizers=optimizer)


def test_applying_twice_warns_and_changes_nothing():
    model = gpt2()
    apply_alibi(model)
    with pytest.warns(UserWarning, match="already applied"):
        assert apply_alibi(model) == {}


def test_bad_config_and_missing_transformers(monkeypatch):
    with pytest.raises(ValueError, match="max_sequence_length"):
        AlibiConfig(max_sequence_length=0)
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r'pip install "trainkit-algorithms\[nlp\]"'):
        apply_alibi(nn.Linear(2, 2))


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "alibi") is Alibi
