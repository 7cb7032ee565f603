"""Evaluation by generation with `HuggingFaceModel` (eval batches with ``"mode": "generate"``)."""

import pytest
import torch

from trainkit.core import Evaluator
from trainkit.trainer import HuggingFaceModel, Trainer
from trainkit.trainer.metrics import CrossEntropy, ExactMatch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "it", "red", "blue"]
PAIRS = {"the cat": "sat on", "a dog": "ran to", "red mat": "blue it", "it sat": "a cat"}


def _tokenizer():
    """A word-level tokenizer trained here (no download), padding prompts on the left."""
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.WordLevelTrainer(special_tokens=["[UNK]", "[PAD]", "[EOS]"])
    model.train_from_iterator([" ".join(WORDS)] * 2, trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=model, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]"
    )
    tokenizer.padding_side = "left"
    return tokenizer


def _gpt2(tokenizer, seed=0, **options) -> HuggingFaceModel:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=len(WORDS) + 3, n_positions=16,
        bos_token_id=2, eos_token_id=2, pad_token_id=1, loss_type="ForCausalLM",
    )  # fmt: skip
    eval_metrics = {"ExactMatch": ExactMatch(), "cross_entropy": CrossEntropy()}
    return HuggingFaceModel(
        transformers.GPT2LMHeadModel(config),
        tokenizer=tokenizer,
        eval_metrics=eval_metrics,
        **options,
    )


def _generate_batch(tokenizer, prompts, answers, **generation_kwargs):
    encoded = tokenizer(prompts, padding=True, return_tensors="pt")
    batch = {
        "mode": "generate",
        "input_ids": encoded["input_ids"],
        "attention_mask": encoded["attention_mask"],
        "answers": list(answers),
    }
    if generation_kwargs:
        batch["generation_kwargs"] = generation_kwargs
    return batch


def _reference_text(model, tokenizer, batch, **kwargs):
    """Direct ``generate`` on the wrapped transformers model, then decode the new tokens."""
    with torch.no_grad():
        out = model.model.generate(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            pad_token_id=tokenizer.pad_token_id,
            **kwargs,
        )
    new = out[:, batch["input_ids"].shape[1] :]
    return tokenizer.batch_decode(new, skip_special_tokens=True)


def _evaluator(batches):
    return Evaluator(label="gen", data=batches, metric_names=["ExactMatch"])


def _eval_trainer(model):
    return Trainer(model=model, progress_bar=False, device="cpu", seed=1)


def test_exact_match_from_trainer_eval_equals_direct_generate_and_compare():
    tokenizer = _tokenizer()
    model = _gpt2(tokenizer, eval_generation_kwargs={"max_new_tokens": 1, "do_sample": False})
    model.eval()
    prompts = ["the cat sat", "a dog", "red", "it sat on a", "blue mat", "to"]
    # Greedy text of this (untrained) model, with the batch's max_new_tokens=3 (overriding
    # the model's default of 1): half the answers are it, half are not.
    greedy = _reference_text(
        model, tokenizer, _generate_batch(tokenizer, prompts, prompts), max_new_tokens=3
    )
    answers = [g if i % 2 == 0 else "cat cat cat cat" for i, g in enumerate(greedy)]
    batches = [
        _generate_batch(tokenizer, prompts[:3], answers[:3], max_new_tokens=3),
        _generate_batch(tokenizer, prompts[3:], answers[3:], max_new_tokens=3),
    ]
    reference = []
    for batch in batches:
        generated = _reference_text(model, tokenizer, batch, max_new_tokens=3, do_sample=False)
        reference += [g.strip() == a for g, a in zip(generated, batch["answers"], strict=True)]
    expected = sum(reference) / len(reference)

    results = _eval_trainer(model).eval(eval_dataloader=_evaluator(batches))
    assert results["metrics/gen/ExactMatch"].item() == pytest.approx(expected)
    assert 0 < expected < 1  # both hits and misses are counted


def test_generation_kwargs_merge_model_defaults_under_the_batch(monkeypatch):
    tokenizer = _tokenizer()
    model = _gpt2(tokenizer, eval_generation_kwargs={"max_new_tokens": 5, "num_beams": 1})
    calls = []
    original = model.model.generate

    def spy(**kwargs):
        calls.append(kwargs)
        return original(**kwargs)

    monkeypatch.setattr(model.model, "generate", spy)
    batch = _generate_batch(tokenizer, ["the cat", "a"], ["x", "y"], max_new_tokens=2)
    with torch.no_grad():
        text = model.eval_forward(batch)
    assert isinstance(text, list) and len(text) == 2 and all(isinstance(t, str) for t in text)
    assert calls[0]["max_new_tokens"] == 2 and calls[0]["num_beams"] == 1
    assert calls[0]["pad_token_id"] == tokenizer.pad_token_id
    # Without a tokenizer pad token, the EOS pads.
    tokenizer.pad_token = None
    with torch.no_grad():
        model.eval_forward({k: v for k, v in batch.items() if k != "generation_kwargs"})
    assert calls[1]["max_new_tokens"] == 5 and calls[1]["pad_token_id"] == tokenizer.eos_token_id


def test_a_model_that_memorised_prompt_to_answer_reaches_exact_match_one():
    tokenizer = _tokenizer()
    model = _gpt2(tokenizer, eval_generation_kwargs={"max_new_tokens": 4})
    texts = [f"{p} {a} [EOS]" for p, a in PAIRS.items()]
    ids = tokenizer(texts, return_tensors="pt")["input_ids"]  # all the same length
    train = [{"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}]
    eval_batches = [_generate_batch(tokenizer, list(PAIRS), list(PAIRS.values()))]
    trainer = Trainer(
        model=model,
        train_dataloader=train,
        optimizers=torch.optim.AdamW(model.parameters(), lr=1e-2),
        max_duration="150ep",
        progress_bar=False,
        device="cpu",
        seed=2,
    )
    before = trainer.eval(eval_dataloader=_evaluator(eval_batches))["metrics/gen/ExactMatch"]
    trainer.fit()
    after = trainer.eval(eval_dataloader=_evaluator(eval_batches))["metrics/gen/ExactMatch"]
    assert before.item() < 1.0
    assert after.item() == 1.0
    # In microbatches of one prompt, the batch's generation_kwargs going to each.
    split = Evaluator(
        label="gen",
        data=[_generate_batch(tokenizer, list(PAIRS), list(PAIRS.values()), max_new_tokens=4)],
        metric_names=["ExactMatch"],
        device_eval_microbatch_size=1,
    )
    assert trainer.eval(eval_dataloader=split)["metrics/gen/ExactMatch"].item() == 1.0
    assert int(trainer.state.eval_metrics["gen"]["ExactMatch"].count) == len(PAIRS)


def test_generate_mode_without_a_tokenizer_is_a_clear_error():
    model = _gpt2(None)
    batch = _generate_batch(_tokenizer(), ["the cat"], ["sat"])
    with pytest.raises(ValueError, match="needs a tokenizer"):
        _eval_trainer(model).eval(eval_dataloader=_evaluator([batch]))


def test_right_padded_prompts_and_missing_answers_are_clear_errors():
    tokenizer = _tokenizer()
    model = _gpt2(tokenizer, eval_generation_kwargs={"max_new_tokens": 1})
    tokenizer.padding_side = "right"
    batch = _generate_batch(tokenizer, ["the cat sat", "a"], ["x", "y"])
    with pytest.raises(ValueError, match="left-padded"), torch.no_grad():
        model.eval_forward(batch)
    tokenizer.padding_side = "left"
    batch = _generate_batch(tokenizer, ["the cat sat", "a"], ["x", "y"])
    del batch["answers"]
    with torch.no_grad():
        outputs = model.eval_forward(batch)
    with pytest.raises(ValueError, match="no 'answers'"):
        model.update_metric(batch, outputs, ExactMatch())
    with pytest.raises(ValueError, match="does not take text"):
        model.update_metric(batch, outputs, CrossEntropy())


def test_the_normal_eval_path_is_unchanged():
    tokenizer = _tokenizer()
    model = _gpt2(tokenizer)
    ids = tokenizer(["the cat sat on a mat", "a dog ran to it red"], return_tensors="pt")[
        "input_ids"
    ]
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    evaluator = Evaluator(label="lm", data=[batch], metric_names=["cross_entropy"])
    results = _eval_trainer(model).eval(eval_dataloader=evaluator)
    model.eval()
    with torch.no_grad():
        expected = model.model(**batch).loss  # the model's own shifted token cross-entropy
    assert results["metrics/lm/cross_entropy"].item() == pytest.approx(expected.item(), rel=1e-5)
    # ExactMatch on a non-generate batch says what it needs.
    with pytest.raises(ValueError, match="'mode': 'generate'"), torch.no_grad():
        model.update_metric(batch, model.eval_forward(batch), ExactMatch())


def test_exact_match_normalises_whitespace_and_accepts_any_listed_answer():
    metric = ExactMatch()
    metric.update(["  sat  on ", "Ran", "blue"], ["sat on", "ran", ["red", "blue"]])
    assert metric.compute().item() == pytest.approx(2 / 3)
    folded = ExactMatch(ignore_case=True)
    folded.update(["Ran"], ["ran"])
    assert folded.compute().item() == 1.0
    with pytest.raises(ValueError, match="one reference"):
        metric.update(["a", "b"], ["a"])
