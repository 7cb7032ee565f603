"""`HuggingFaceModel` with a tiny randomly initialised GPT-2, trained by the `Trainer` on CPU."""

import math
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader

from trainkit.core import Callback
from trainkit.trainer import HuggingFaceModel, Trainer

transformers = pytest.importorskip("transformers")

VOCAB = 64
PERIOD = 16  # sequences count up modulo PERIOD: the next token is always learnable


def _gpt2(seed: int = 0) -> HuggingFaceModel:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=32,
        vocab_size=VOCAB,
        n_positions=32,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
        loss_type="ForCausalLM",
    )
    return HuggingFaceModel(transformers.GPT2LMHeadModel(config))


def _batches(
    count: int, *, batch_size: int = 8, seq_len: int = 16, seed: int = 0
) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        start = torch.randint(0, PERIOD, (batch_size, 1), generator=generator)
        input_ids = (start + torch.arange(seq_len)) % PERIOD
        batches.append(
            {
                "input_ids": input_ids,
                "attention_mask": torch.ones_like(input_ids),
                "labels": input_ids.clone(),
            }
        )
    return batches


class _LossRecorder(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def after_loss(self, state, logger) -> None:
        self.losses.append(state.loss.item())


def _trainer(model: HuggingFaceModel, train, **kwargs) -> Trainer:
    return Trainer(
        model=model,
        train_dataloader=train,
        optimizers=torch.optim.AdamW(model.parameters(), lr=3e-3),
        device="cpu",
        seed=0,
        progress_bar=False,
        **kwargs,
    )


def test_loss_decreases_on_a_learnable_pattern():
    recorder = _LossRecorder()
    trainer = _trainer(_gpt2(), _batches(30), max_duration="30ba", callbacks=[recorder])
    trainer.fit()

    losses = recorder.losses
    assert len(losses) == 30
    assert losses[0] == pytest.approx(math.log(VOCAB), rel=0.2)  # random init: ~uniform
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.5 * first, f"loss went from {first:.3f} to only {last:.3f}"


def test_eval_metrics_are_shifted_token_cross_entropy_and_its_exp():
    model, eval_batches = _gpt2(), _batches(3, seed=1)
    trainer = _trainer(model, _batches(20), max_duration="20ba", eval_dataloader=eval_batches)
    trainer.fit()
    results = trainer.eval()

    cross_entropy = results["metrics/eval/cross_entropy"]
    perplexity = results["metrics/eval/perplexity"]
    torch.testing.assert_close(perplexity, torch.exp(cross_entropy))
    # Every label is counted and batches are equal-sized, so the token mean is the mean of
    # the model's own (internally shifted) per-batch losses.
    model.eval()
    with torch.no_grad():
        expected = sum(model(b).loss for b in eval_batches) / len(eval_batches)
    torch.testing.assert_close(cross_entropy, expected.float(), rtol=1e-4, atol=1e-5)
    assert cross_entropy < math.log(VOCAB) / 2  # it learned something


def test_batch_without_labels_raises_value_error_naming_labels():
    no_labels = [{k: v for k, v in b.items() if k != "labels"} for b in _batches(2)]
    trainer = _trainer(_gpt2(), no_labels, max_duration="1ba")
    with pytest.raises(ValueError, match="labels"):
        trainer.fit()

    trainer = _trainer(_gpt2(), _batches(2), max_duration="1ba")
    with pytest.raises(ValueError, match="labels"):
        trainer.eval(eval_dataloader=no_labels)


def test_non_dict_batch_raises_type_error():
    tensors = [b["input_ids"] for b in _batches(2)]
    trainer = _trainer(_gpt2(), tensors, max_duration="1ba")
    with pytest.raises(TypeError, match="dict"):
        trainer.fit()


def test_token_count_is_the_non_padding_tokens_seen():
    batches = _batches(4, batch_size=4, seq_len=12)
    for i, batch in enumerate(batches):  # right-pad a different amount in each row
        for row in range(4):
            pad = (i + row) % 5
            if pad:
                batch["attention_mask"][row, -pad:] = 0
                batch["labels"][row, -pad:] = -100
    per_epoch = sum(int(b["attention_mask"].sum()) for b in batches)
    assert per_epoch < 4 * 4 * 12

    trainer = _trainer(_gpt2(), batches, max_duration="2ep")
    trainer.fit()

    timestamp = trainer.state.timestamp
    assert timestamp.token == 2 * per_epoch
    assert timestamp.sample == 2 * 4 * 4
    assert timestamp.batch == 8


def test_import_trainkit_trainer_does_not_import_transformers():
    code = "import trainkit.trainer, sys; assert 'transformers' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _fit_one_batch(batch, microbatch_size, build=None):
    model = build() if build is not None else _gpt2(seed=3)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0  # every run must compute the same function
    trainer = Trainer(
        model=model,
        train_dataloader=[batch],
        optimizers=torch.optim.SGD(model.parameters(), lr=1.0),
        max_duration="1ba",
        device="cpu",
        progress_bar=False,
        device_train_microbatch_size=microbatch_size,
    )
    trainer.fit()
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return float(trainer.state.total_loss), weights


def test_gradient_accumulation_with_padding_matches_the_full_batch():
    # Rows 2-3 are mostly padding: weighting microbatches by samples would overweight
    # their few tokens; the token-mean loss needs weights by label tokens.
    batch = _batches(1, batch_size=4, seq_len=8)[0]
    batch["labels"][2:, 2:] = -100
    batch["attention_mask"][2:, 2:] = 0
    _, whole = _fit_one_batch(batch, None)
    _, accumulated = _fit_one_batch(batch, 2)
    torch.testing.assert_close(whole, accumulated, rtol=1e-5, atol=1e-5)


def test_a_microbatch_without_label_tokens_adds_nothing_instead_of_nan():
    # Sample 1 is all prompt (every label -100), as after truncation in fine-tuning: alone
    # in a microbatch, a plain token mean would be 0/0 and make the whole step NaN.
    batch = _batches(1, batch_size=4, seq_len=8)[0]
    batch["labels"][1] = -100
    whole_loss, whole = _fit_one_batch(batch, None)
    for size in (1, 2):
        loss, weights = _fit_one_batch(batch, size)
        assert loss == pytest.approx(whole_loss, abs=1e-6)
        torch.testing.assert_close(weights, whole, rtol=1e-5, atol=1e-5)
    # A batch with no label token at all trains nothing (loss 0), rather than NaN.
    batch["labels"][:] = -100
    loss, weights = _fit_one_batch(batch, None)
    initial = torch.cat([p.detach().reshape(-1) for p in _gpt2(seed=3).parameters()])
    assert loss == 0.0 and torch.equal(weights, initial)


def _bert(seed: int = 5) -> HuggingFaceModel:
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        num_hidden_layers=1, num_attention_heads=2, hidden_size=16, intermediate_size=32,
        vocab_size=VOCAB, max_position_embeddings=32,
    )  # fmt: skip
    return HuggingFaceModel(transformers.BertForMaskedLM(config))


def test_a_masked_lm_microbatch_without_masked_tokens_adds_nothing_instead_of_nan():
    # BERT's loss takes no num_items_in_batch: a microbatch of samples with no masked token
    # has a 0/0 token mean (NaN) and a zero gradient. It must add nothing to the step, which
    # then equals one pass over the whole batch, instead of stopping it as non-finite.
    batch = _batches(1, batch_size=4, seq_len=8)[0]
    batch["labels"][:2] = -100  # samples 0 and 1: nothing masked
    batch["labels"][2:, :5] = -100
    whole_loss, whole = _fit_one_batch(batch, None, _bert)
    assert math.isfinite(whole_loss)
    for size in (1, 2):
        loss, weights = _fit_one_batch(batch, size, _bert)
        assert loss == pytest.approx(whole_loss, rel=1e-5)
        torch.testing.assert_close(weights, whole, rtol=1e-5, atol=1e-5)


def test_a_model_whose_forward_takes_no_loss_arguments_is_called_without_them():
    class Plain(torch.nn.Module):
        """A causal LM by name, whose forward takes only its inputs."""

        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, VOCAB)
            self.config = transformers.GPT2Config()

        def forward(self, input_ids, labels):
            logits = self.embed(input_ids)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
            return {"loss": loss, "logits": logits}

    Plain.__name__ = "PlainForCausalLM"
    model = HuggingFaceModel(Plain())
    assert model.shift_labels  # so the label tokens are counted, but not passed on
    batch = _batches(1, batch_size=2, seq_len=4)[0]
    del batch["attention_mask"]
    assert torch.isfinite(model.loss(model(batch), batch))


def test_from_pretrained_builds_the_wrapper_from_a_save_pretrained_folder(tmp_path):
    original = _gpt2(seed=4).model
    original.save_pretrained(tmp_path / "gpt2")
    model = HuggingFaceModel.from_pretrained(tmp_path / "gpt2")  # the class the config names
    assert type(model.model).__name__ == "GPT2LMHeadModel" and model.shift_labels
    assert model.tokenizer is None  # the folder has none
    ids = torch.arange(10).reshape(2, 5)
    original.eval(), model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(dict(input_ids=ids)).logits, original(ids).logits)

    torch.manual_seed(0)
    config = transformers.BertConfig(
        num_hidden_layers=1, num_attention_heads=2, hidden_size=16, intermediate_size=32,
        vocab_size=VOCAB, num_labels=3,
    )  # fmt: skip
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path / "bert")
    classifier = HuggingFaceModel.from_pretrained(tmp_path / "bert", task="masked-lm")
    assert type(classifier.model).__name__ == "BertForMaskedLM"  # the task picks the head
    assert not classifier.shift_labels

    raw = (tmp_path / "bert" / "config.json").read_text()
    (tmp_path / "bert" / "config.json").write_text(
        raw.replace("BertForSequenceClassification", "os.system")
    )
    with pytest.raises(ValueError, match=r"names the model class\(es\) \['os.system'\]"):
        HuggingFaceModel.from_pretrained(tmp_path / "bert")


def test_from_config_builds_a_fresh_model_from_a_mapping_or_a_config():
    from transformers import BertConfig, LlamaForCausalLM

    fields = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1}  # fmt: skip
    torch.manual_seed(0)
    llama = HuggingFaceModel.from_config({"model_type": "llama", **fields})
    assert isinstance(llama.model, LlamaForCausalLM)
    assert llama.model.config.num_key_value_heads == 1
    assert llama.shift_labels  # a causal LM: logits at t are scored against labels at t+1
    torch.manual_seed(0)
    again = HuggingFaceModel.from_config(llama.model.config)
    for (name, a), (_, b) in zip(
        llama.state_dict().items(), again.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name  # the same seed: the same initial weights
    bert = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                      num_attention_heads=2, intermediate_size=32, num_labels=3)  # fmt: skip
    classifier = HuggingFaceModel.from_config(bert, task="sequence-classification")
    batch = {"input_ids": torch.randint(0, 64, (2, 5)), "labels": torch.tensor([0, 2])}
    assert classifier(batch).logits.shape == (2, 3)


def test_from_config_on_the_meta_device_is_allocated_and_initialised_by_the_trainer():
    fields = {"model_type": "llama", "vocab_size": 64, "hidden_size": 16,
              "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
              "num_key_value_heads": 1}  # fmt: skip
    model = HuggingFaceModel.from_config(fields, meta=True)
    assert all(p.is_meta for p in model.parameters())
    ids = torch.randint(0, 64, (16, 8), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in ids]
    trainer = Trainer(model=model, train_dataloader=DataLoader(data, batch_size=4),
                      max_duration="2ba", device="cpu", seed=5, progress_bar=False)  # fmt: skip
    llama = trainer.state.model.model
    assert not any(p.is_meta or b.is_meta for p in llama.parameters() for b in llama.buffers())
    # transformers' init: normal(0, initializer_range) projections, unit norms, and the
    # rotary frequencies it computes (a buffer the meta device left empty).
    std = llama.config.initializer_range
    assert float(llama.model.layers[0].mlp.up_proj.weight.detach().std()) == pytest.approx(
        std, rel=0.2
    )
    assert torch.equal(llama.model.norm.weight.detach(), torch.ones(16))
    built = HuggingFaceModel.from_config(fields).model.model.rotary_emb.inv_freq
    assert torch.equal(llama.model.rotary_emb.inv_freq, built)
    trainer.fit()
    assert 3.5 < float(trainer.state.loss.detach()) < 4.8  # about ln(64) = 4.16: a working model
    with pytest.raises(TypeError, match="meta must be True or False"):
        HuggingFaceModel.from_config(fields, meta="yes")


def _saved_gpt2(folder, seed=0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=64, n_positions=16,
                        bos_token_id=0, eos_token_id=0)  # fmt: skip
    model = GPT2LMHeadModel(config)
    model.save_pretrained(folder)  # safetensors: the tied head is stored once
    return model


def test_from_pretrained_on_the_meta_device_reads_the_weights_once_placed(tmp_path):
    saved = _saved_gpt2(tmp_path / "gpt2")
    model = HuggingFaceModel.from_pretrained(tmp_path / "gpt2", meta=True)
    assert all(p.is_meta for p in model.parameters())
    ids = torch.randint(0, 64, (16, 8), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in ids]
    trainer = Trainer(model=model, train_dataloader=DataLoader(data, batch_size=4),
                      max_duration="2ba", device="cpu", seed=5, progress_bar=False)  # fmt: skip
    placed = trainer.state.model.model
    assert placed.lm_head.weight is placed.transformer.wte.weight
    for name, value in saved.state_dict().items():
        assert torch.equal(placed.state_dict()[name], value), name  # the saved weights
    trainer.fit()
    assert math.isfinite(float(trainer.state.loss.detach()))


def test_from_pretrained_on_the_meta_device_names_what_it_cannot_read(tmp_path):
    from safetensors.torch import load_file, save_file

    saved = _saved_gpt2(tmp_path / "bin")
    saved.save_pretrained(tmp_path / "bin", safe_serialization=False)
    for file in (tmp_path / "bin").glob("*.safetensors"):
        file.unlink()
    with pytest.raises(ValueError, match=r"reads the weights from the folder's \*.safetensors"):
        HuggingFaceModel.from_pretrained(tmp_path / "bin", meta=True)
    _saved_gpt2(tmp_path / "partial")
    [file] = (tmp_path / "partial").glob("*.safetensors")
    tensors = load_file(file)
    del tensors["transformer.h.1.mlp.c_fc.weight"]
    save_file(tensors, file, metadata={"format": "pt"})
    model = HuggingFaceModel.from_pretrained(tmp_path / "partial", meta=True)
    with pytest.raises(ValueError, match=r"lack \['transformer.h.1.mlp.c_fc.weight'\] \(1 of"):
        Trainer(model=model, device="cpu", progress_bar=False)


def test_from_config_names_what_is_missing_or_unknown():
    with pytest.raises(ValueError, match=r"needs 'model_type'.*got keys \['hidden_size'\]"):
        HuggingFaceModel.from_config({"hidden_size": 16})
    with pytest.raises(ValueError, match="task 'vision' is not known; use one of"):
        HuggingFaceModel.from_config({"model_type": "gpt2"}, task="vision")
