"""alibi: slopes for any head count; GPT-2, BERT and RoBERTa trained short evaluate long;
masks keep working; every assumption of the surgery fails clearly, naming the module."""

import copy
import math
import sys

import pytest
import torch
from torch import nn

from trainkit.algorithms.alibi import (
    Alibi,
    AlibiAttention,
    AlibiConfig,
    ZeroPositionEmbedding,
    alibi_bias,
    alibi_slopes,
    apply_alibi,
    scale_sequence_length,
)
from trainkit.core import Callback, plugins
from trainkit.trainer import HuggingFaceModel, Trainer

transformers = pytest.importorskip("transformers")

VOCAB, L, HEADS, WIDTH = 32, 16, 12, 48  # 12 heads as GPT-2 small / BERT-base, head size 4


@pytest.fixture(autouse=True)
def one_thread():
    # Models this small run faster on one thread; two spin-wait on a shared 2-core machine
    # (the training test takes ~3 s of CPU on one thread, ~13 s on two).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def gpt2(n_head=HEADS, n_embd=WIDTH, n_layer=2, **kwargs):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=VOCAB, n_positions=L,
        bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM", resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, **kwargs,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def masked_lm(family, **kwargs):
    torch.manual_seed(0)
    config_class, model_class = {
        "bert": (transformers.BertConfig, transformers.BertForMaskedLM),
        "roberta": (transformers.RobertaConfig, transformers.RobertaForMaskedLM),
    }[family]
    config = config_class(
        vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=2, num_attention_heads=HEADS,
        intermediate_size=64, max_position_embeddings=L + (2 if family == "roberta" else 0),
        pad_token_id=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **kwargs,
    )  # fmt: skip
    return model_class(config)


def stepping(batch_size, length, generator):
    """x[t+1] = x[t] + c (mod VOCAB), c in {1, 2, 3} per sequence: the next token needs the
    previous two, so the model must use relative position; after the first step, exact."""
    start = torch.randint(0, VOCAB, (batch_size, 1), generator=generator)
    step = torch.randint(1, 4, (batch_size, 1), generator=generator)
    ids = (start + step * torch.arange(length)) % VOCAB
    return {"input_ids": ids, "labels": ids}


# --- slopes and bias ----------------------------------------------------------------------


def paper_slopes(n):
    """Press et al.'s definition, written out independently of the implementation."""
    if math.log2(n).is_integer():
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]
    closest = 2 ** math.floor(math.log2(n))
    return paper_slopes(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("heads", [1, 2, 3, 5, 6, 8, 12, 16, 20, 24, 25, 32, 40, 48, 64, 96])
def test_slopes_follow_the_paper_for_any_head_count(heads):
    slopes = alibi_slopes(heads)
    assert slopes.shape == (heads,) and slopes.dtype == torch.float32
    torch.testing.assert_close(slopes, torch.tensor(paper_slopes(heads)))


def test_slopes_for_8_and_12_heads_are_the_stated_values():
    # 8 heads: 1/2, 1/4, ..., 1/256 (the paper's example).
    assert alibi_slopes(8).tolist() == [2.0**-h for h in range(1, 9)]
    # 12 heads: those 8, then the 1st, 3rd, 5th, 7th slopes of 16 heads (2^-0.5, 2^-1.5, ...).
    expected = [2.0**-h for h in range(1, 9)] + [2.0 ** -(h - 0.5) for h in range(1, 5)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected))


@pytest.mark.parametrize("bad", [0, -4, 2.0, True, "8"])
def test_slopes_refuse_what_is_not_a_head_count(bad):
    with pytest.raises(ValueError, match="positive int number of attention heads"):
        alibi_slopes(bad)


def test_bias_is_minus_slope_times_distance():
    causal = alibi_bias(torch.tensor([0.5]), 2, 3, causal=True)[0]  # queries at positions 1, 2
    assert causal[0].tolist() == [-0.5, 0.0, -math.inf]
    assert causal[1].tolist() == [-1.0, -0.5, 0.0]
    both = alibi_bias(torch.tensor([0.5]), 3, 3, causal=False)[0]
    assert both[0].tolist() == [0.0, -0.5, -1.0] and torch.equal(both, both.T)


# --- GPT-2 ----------------------------------------------------------------------------------


class SeenLengths(Callback):
    def __init__(self):
        self.lengths = set()

    def before_forward(self, state, logger):
        self.lengths.add(state.batch["input_ids"].shape[1])


def test_gpt2_12_heads_trained_at_l_evaluates_at_2l_and_4l():
    model = gpt2()
    generator = torch.Generator().manual_seed(1)
    seen = SeenLengths()
    trainer = Trainer(
        model=HuggingFaceModel(model),
        # Batches of 8 sequences of 4L; the algorithm trains on 32 sequences of L.
        train_dataloader=[stepping(8, 4 * L, generator) for _ in range(150)],
        optimizers=torch.optim.AdamW(model.parameters(), lr=3e-3),
        max_duration="150ba",
        algorithms=[Alibi(max_sequence_length=4 * L, train_sequence_length_scaling=0.25)],
        callbacks=[seen],
        progress_bar=False,
        device="cpu",
        seed=0,
    )
    assert isinstance(model.transformer.wpe, ZeroPositionEmbedding)
    assert all(isinstance(block.attn, AlibiAttention) for block in model.transformer.h)
    trainer.fit()
    assert seen.lengths == {L}
    model.eval()
    held_out = torch.Generator().manual_seed(99)
    with torch.no_grad():
        at = {k: model(**stepping(64, k * L, held_out)).loss.item() for k in (1, 2, 4)}
    # It learned the task (chance is log 32 = 3.47; the first step, c, is a guess of 3) ...
    assert at[1] < 0.1 * math.log(VOCAB)
    # ... and longer held-out sequences are no worse. No tolerance: only the first step is
    # uncertain, and it weighs 1/(kL - 1) of the loss, so a model that extrapolates does
    # better at 2L and 4L; one that does not (learned positions, below) is far worse.
    assert at[2] <= at[1] and at[4] <= at[1], at
    # With learned position embeddings the same model cannot even run at 2L.
    with pytest.raises(IndexError):
        gpt2().eval()(**stepping(2, 2 * L, held_out))


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_gpt2_keeps_its_causal_and_padding_masks(implementation):
    model = gpt2(attn_implementation=implementation).eval()
    apply_alibi(model, max_sequence_length=4 * L)
    ids = torch.randint(0, VOCAB, (2, 3 * L), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(input_ids=ids).logits
        # Causal: the first tokens do not see what follows them.
        changed = ids.clone()
        changed[:, L:] = (changed[:, L:] + 1) % VOCAB
        torch.testing.assert_close(model(input_ids=changed).logits[:, :L], full[:, :L])
        # Padding: left-padded rows give the same logits for their real tokens (distances
        # between real tokens do not change) whatever the padding holds.
        pad = 5
        padded = torch.cat([torch.randint(0, VOCAB, (2, pad)), ids], dim=1)
        mask = torch.ones_like(padded)
        mask[:, :pad] = 0
        out = model(input_ids=padded, attention_mask=mask).logits
    assert not out.isnan().any()
    torch.testing.assert_close(out[:, pad:], full, atol=1e-5, rtol=1e-4)


def test_causal_prefix_and_kv_cache_agree_with_the_full_sequence():
    model = gpt2().eval()
    apply_alibi(model, max_sequence_length=64)
    ids = stepping(2, 40, torch.Generator().manual_seed(1))["input_ids"]
    with torch.no_grad():
        full = model(input_ids=ids).logits
        torch.testing.assert_close(model(input_ids=ids[:, :10]).logits, full[:, :10])
        generated = model.generate(
            ids[:, :5], attention_mask=torch.ones_like(ids[:, :5]), max_new_tokens=4,
            do_sample=False,
        )  # fmt: skip
        greedy = model(input_ids=generated[:, :-1]).logits.argmax(-1)[:, 4:]
    assert torch.equal(greedy, generated[:, 5:])


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_gpt2_under_bf16_autocast(implementation):
    model = gpt2(attn_implementation=implementation)
    apply_alibi(model, max_sequence_length=4 * L)
    batch = stepping(2, 2 * L, torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(**batch).loss
    loss.backward()
    assert loss.isfinite() and model.lm_head.weight.grad.isfinite().all()


# --- BERT and RoBERTa -----------------------------------------------------------------------


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_masked_lm_trains_beyond_its_position_table_and_keeps_padding_masks(family, implementation):
    model = masked_lm(family, attn_implementation=implementation)
    optimizer = torch.optim.AdamW(model.parameters())
    replaced = apply_alibi(model, max_sequence_length=4 * L, optimizers=optimizer)
    prefix = "bert" if family == "bert" else "roberta"
    assert sorted(replaced) == [
        f"{prefix}.embeddings.position_embeddings",
        f"{prefix}.encoder.layer.0.attention.self",
        f"{prefix}.encoder.layer.1.attention.self",
    ]
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for p in model.parameters()}  # the position table left both
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(2, VOCAB, (2, 3 * L), generator=generator)  # 3L > the table's L
    labels = torch.full_like(ids, -100)
    labels[:, ::5] = ids[:, ::5]
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    optimizer.step()
    assert loss.isfinite()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    with torch.no_grad():  # up to max_sequence_length (RoBERTa's positions start at pad + 1)
        assert model(input_ids=torch.randint(2, VOCAB, (1, 4 * L))).logits.shape[1] == 4 * L

    model.eval()
    real, pad = 2 * L, L
    with torch.no_grad():
        alone = model(input_ids=ids[:1, :real]).logits
        padded = torch.cat([ids[:1, :real], torch.full((1, pad), 1)], dim=1)
        mask = torch.cat([torch.ones(1, real), torch.zeros(1, pad)], dim=1).long()
        out = model(input_ids=padded, attention_mask=mask).logits
        other = padded.clone()
        other[:, real:] = torch.randint(2, VOCAB, (1, pad), generator=generator)
        out_other = model(input_ids=other, attention_mask=mask).logits
        # Bidirectional: the first token sees the last real one.
        changed = ids[:1, :real].clone()
        changed[:, -1] = (changed[:, -1] + 1) % VOCAB
        first = model(input_ids=changed).logits[:, 0]
    # Masked padding changes nothing for the real tokens, whatever it holds.
    torch.testing.assert_close(out[:, :real], alone, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out_other[:, :real], alone, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(first, alone[:, 0])


# --- placement, limits, checks ----------------------------------------------------------------


@pytest.mark.parametrize("build", [gpt2, lambda: masked_lm("roberta")])
def test_everything_new_lands_on_the_model_device_and_dtype(build):
    model = build().to("meta")
    apply_alibi(model, max_sequence_length=4 * L)
    assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {"meta"}
    model = build().double().eval()
    apply_alibi(model, max_sequence_length=4 * L)
    floats = [t for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()]
    assert {t.dtype for t in floats} == {torch.float64}
    with torch.no_grad():
        ids = torch.randint(2, VOCAB, (2, 2 * L))
        assert model(input_ids=ids).logits.dtype == torch.float64


def test_bias_is_shared_built_lazily_and_left_out_of_copies_and_checkpoints():
    model = gpt2().eval()
    apply_alibi(model, max_sequence_length=4 * L)
    biases = {id(block.attn.bias) for block in model.transformer.h}
    assert len(biases) == 1  # one bias for every layer
    bias = model.transformer.h[0].attn.bias
    assert bias.num_heads == HEADS and bias.causal and bias.max_sequence_length == 4 * L
    keys = list(model.state_dict())
    assert len(keys) == len(gpt2().state_dict()) - 1  # the position table, nothing added
    assert not any("slopes" in key or "_built" in key for key in keys)
    with torch.no_grad():
        model(input_ids=torch.zeros(1, L, dtype=torch.long))
    assert bias._built[torch.device("cpu")].shape == (HEADS, L, L)  # built to what was seen
    twin = copy.deepcopy(model)
    twin_bias = twin.transformer.h[0].attn.bias
    assert twin_bias is not bias and twin_bias._built == {}
    with torch.no_grad():
        ids = torch.randint(0, VOCAB, (1, 2 * L))
        torch.testing.assert_close(twin(input_ids=ids).logits, model(input_ids=ids).logits)


def test_a_sequence_beyond_max_sequence_length_is_a_clear_error():
    model = gpt2().eval()
    apply_alibi(model, max_sequence_length=2 * L)
    with pytest.raises(ValueError, match=r"transformer\.h\.0\.attn.*48 positions.*=32"):
        model(input_ids=torch.zeros(1, 3 * L, dtype=torch.long))


def test_refuses_models_it_does_not_fit():
    with pytest.raises(ValueError, match="supports Hugging Face GPT-2, BERT, RoBERTa"):
        apply_alibi(nn.Linear(2, 2))
    model = gpt2()
    model.transformer.wpe = nn.Identity()
    with pytest.raises(
        ValueError, match=r"transformer \(GPT2Model\).*no learned position embedding `wpe`"
    ):
        apply_alibi(model)
    model = gpt2()
    model.transformer.h[1].attn.num_heads = 5  # 5 heads cannot split a width of 48
    with pytest.raises(ValueError, match=r"transformer\.h\.1\.attn \(GPT2Attention\), 5 heads"):
        apply_alibi(model)
    model = gpt2()
    del model.transformer.h[0].attn.num_heads
    with pytest.raises(ValueError, match=r"transformer\.h\.0\.attn.*no attribute `num_heads`"):
        apply_alibi(model)
    model = masked_lm("bert")
    model.bert.encoder.layer[0].attention.self.is_causal = None
    with pytest.raises(ValueError, match=r"layer\.0\.attention\.self.*`is_causal`"):
        apply_alibi(model)
    model = masked_lm("bert")
    del model.bert.embeddings.position_ids
    with pytest.raises(ValueError, match=r"bert\.embeddings \(BertEmbeddings\).*`position_ids`"):
        apply_alibi(model)
    embeddings = masked_lm("bert").bert.embeddings
    with pytest.raises(ValueError, match=r"found BERT modules .* but no BertSelfAttention"):
        apply_alibi(nn.ModuleDict({"embeddings": embeddings}))
    model = gpt2()
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(
        ValueError, match=r"h\.0\.attn.*'flash_attention_2' attention implementation"
    ):
        apply_alibi(model)
    with pytest.raises(ValueError, match=r"h\.0\.attn .*needs 768\.0 GiB.*at most 18918"):
        apply_alibi(gpt2(), max_sequence_length=2**17)
    assert isinstance(model.transformer.wpe, nn.Embedding)  # nothing changed on refusal


def test_switching_to_an_implementation_without_masks_after_surgery_is_an_error():
    model = gpt2()
    apply_alibi(model, max_sequence_length=4 * L)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match=r"transformer\.h\.0\.attn: the 'flash_attention_2'"):
        model(input_ids=torch.zeros(1, L, dtype=torch.long))


def test_refuses_after_training_started():
    model = gpt2()
    optimizer = torch.optim.Adam(model.parameters())
    model(**stepping(2, 8, torch.Generator().manual_seed(0))).loss.backward()
    optimizer.step()
    with pytest.raises(ValueError, match="alibi changes the model, but Adam already holds state"):
        apply_alibi(model, optimizers=optimizer)
    assert isinstance(model.transformer.wpe, nn.Embedding)


def test_applying_twice_warns_and_changes_nothing():
    model = gpt2()
    apply_alibi(model)
    with pytest.warns(UserWarning, match="already applied"):
        assert apply_alibi(model) == {}


# --- training length ------------------------------------------------------------------------


def test_scaling_reshapes_sequences_into_more_shorter_rows():
    ids = torch.arange(2 * 18).view(2, 18)
    batch = {"input_ids": ids, "attention_mask": torch.ones(2, 18), "labels": ids + 100}
    out = scale_sequence_length(batch, 0.25)  # int(18 * 0.25) = 4: 4 rows each, 2 tokens left
    expected = ids[:, :16].reshape(8, 4)
    assert torch.equal(out["input_ids"], expected)
    assert torch.equal(out["labels"], expected + 100) and out["attention_mask"].shape == (8, 4)
    assert scale_sequence_length(batch, 1.0)["input_ids"] is ids
    with pytest.raises(ValueError, match=r"'label' \(shape \(2,\)\) holds one value per sample"):
        scale_sequence_length({"input_ids": ids, "label": torch.zeros(2)}, 0.5)
    with pytest.raises(ValueError, match="dict batches with an 'input_ids'"):
        scale_sequence_length((ids, ids), 0.5)


def test_scaling_runs_only_in_training_and_only_below_one():
    from trainkit.core import Event

    assert Alibi(train_sequence_length_scaling=0.5).match(Event.AFTER_DATALOADER, None)
    assert not Alibi(train_sequence_length_scaling=1.0).match(Event.AFTER_DATALOADER, None)
    assert not Alibi().match(Event.EVAL_BEFORE_FORWARD, None)


@pytest.mark.parametrize(
    "options",
    [
        {"max_sequence_length": 0},
        {"max_sequence_length": 1.5},
        {"train_sequence_length_scaling": 0.0},
        {"train_sequence_length_scaling": 1.5},
        {"train_sequence_length_scaling": True},
    ],
)
def test_bad_config(options):
    with pytest.raises(ValueError, match=next(iter(options))):
        AlibiConfig(**options)


def test_missing_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r'pip install "trainkit-algorithms\[nlp\]"'):
        apply_alibi(nn.Linear(2, 2))


def test_entry_point():
    assert plugins.load("trainkit.algorithms", "alibi") is Alibi
