"""The HuggingFace round trip: a checkpoint of a `HuggingFaceModel` carries its config and
tokenizer; ``trainkit checkpoint export --format hf`` writes a folder ``from_pretrained``
loads with equal logits; `HuggingFaceModel.from_pretrained` trains on from it."""

import json

import pytest
import torch

from trainkit.checkpoint import (
    Checkpointer,
    CheckpointError,
    UnsafePathError,
    export_checkpoint,
    inspect_checkpoint,
    verify_checkpoint,
)
from trainkit.checkpoint._cli import main as checkpoint_cli
from trainkit.checkpoint._manifest import hash_file
from trainkit.trainer import HuggingFaceModel, Trainer

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

WORDS = ["the", "cat", "sat", "on", "a", "mat", "while", "dog", "ran", "to", "it", "and", "then"]


def _tokenizer():
    """A word-level tokenizer trained here (no download), as transformers' fast tokenizer."""
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.WordLevelTrainer(special_tokens=["[UNK]", "[PAD]", "[EOS]"])
    model.train_from_iterator([" ".join(WORDS)] * 2, trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=model, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]"
    )


def _vocab() -> int:
    return len(WORDS) + 3


def _gpt2(tokenizer=None, seed=0) -> HuggingFaceModel:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=_vocab(), n_positions=32,
        bos_token_id=2, eos_token_id=2, pad_token_id=1, loss_type="ForCausalLM",
    )  # fmt: skip
    return HuggingFaceModel(transformers.GPT2LMHeadModel(config), tokenizer=tokenizer)


def _bert(seed=0) -> HuggingFaceModel:
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
        vocab_size=_vocab(), max_position_embeddings=32, num_labels=3,
    )  # fmt: skip
    return HuggingFaceModel(transformers.BertForSequenceClassification(config))


def _lm_batches(count=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        ids = torch.randint(3, _vocab(), (4, 10), generator=generator)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    return out


def _cls_batches(count=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        ids = torch.randint(3, _vocab(), (4, 10), generator=generator)
        labels = ids[:, 0] % 3
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    return out


def _train(model, batches, folder, duration="1ep"):
    trainer = Trainer(
        model=model,
        train_dataloader=batches,
        optimizers=torch.optim.AdamW(model.parameters(), lr=1e-2),
        max_duration=duration,
        callbacks=[Checkpointer(folder=str(folder), interval="1ep")] if folder else [],
        progress_bar=False,
        device="cpu",
        seed=3,
    )
    trainer.fit()
    return trainer


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory):
    """A tiny GPT-2 with a tokenizer, trained one epoch and checkpointed."""
    folder = tmp_path_factory.mktemp("hf") / "ckpt"
    model = _gpt2(_tokenizer())
    _train(model, _lm_batches(), folder)
    return folder, model


def test_config_and_tokenizer_travel_with_the_checkpoint(gpt2_run):
    folder, model = gpt2_run
    checkpoint = folder / "ep1-ba4"
    manifest = verify_checkpoint(checkpoint)  # checked like the shards
    names = set(manifest.files)
    assert {"hf-config.json", "hf-generation_config.json", "hf-tokenizer.json"} <= names
    assert "hf-tokenizer_config.json" in names
    config = json.loads((checkpoint / "hf-config.json").read_text())
    assert config["architectures"] == ["GPT2LMHeadModel"]
    assert config["n_embd"] == 32 and config["vocab_size"] == _vocab()
    assert inspect_checkpoint(checkpoint)["files"]["hf-config.json"] > 0
    # The live model's config is left as it was (architectures set on a copy only).
    assert model.model.config.architectures is None


def test_hf_export_loads_with_from_pretrained_with_equal_logits(gpt2_run, tmp_path, capsys):
    folder, model = gpt2_run
    out = tmp_path / "gpt2-hf"
    assert checkpoint_cli(["export", str(folder), "--format", "hf", "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert type(loaded).__name__ == "GPT2LMHeadModel"
    ids = torch.randint(0, _vocab(), (3, 12), generator=torch.Generator().manual_seed(5))
    model.eval()
    torch.testing.assert_close(_logits(loaded, ids), _logits(model.model, ids), rtol=0, atol=0)
    # The tokenizer round-trips: same ids for the same text, same special tokens.
    tokenizer = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    text = "the cat sat on the mat"
    assert tokenizer(text)["input_ids"] == model.tokenizer(text)["input_ids"]
    assert tokenizer.pad_token == "[PAD]" and tokenizer.eos_token == "[EOS]"
    # A second export to the same folder is refused rather than mixing two exports.
    assert checkpoint_cli(["export", str(folder), "--format", "hf", "--out", str(out)]) == 1
    assert "already exists" in capsys.readouterr().err


def test_huggingface_model_starts_from_the_folder_and_trains_on(gpt2_run, tmp_path):
    folder, model = gpt2_run
    out = tmp_path / "hf"
    export_checkpoint(folder, out, format="hf")
    resumed = HuggingFaceModel.from_pretrained(out, task="causal-lm")
    assert resumed.shift_labels and resumed.tokenizer is not None
    ids = torch.arange(12).reshape(2, 6) % _vocab()
    model.eval()
    torch.testing.assert_close(_logits(resumed.model, ids), _logits(model.model, ids))
    by_architecture = HuggingFaceModel.from_pretrained(out, tokenizer=None)
    assert type(by_architecture.model).__name__ == "GPT2LMHeadModel"
    assert by_architecture.tokenizer is None
    before = [p.detach().clone() for p in resumed.parameters()]
    trainer = _train(resumed, _lm_batches(seed=1), None)
    assert trainer.state.timestamp.batch == 4
    assert any(not torch.equal(a, b) for a, b in zip(before, resumed.parameters(), strict=True))
    with pytest.raises(ValueError, match=r"task 'chat' is not known; use one of"):
        HuggingFaceModel.from_pretrained(out, task="chat")


def test_sequence_classification_round_trip(tmp_path):
    folder = tmp_path / "ckpt"
    model = _bert()
    _train(model, _cls_batches(), folder)
    out = tmp_path / "bert-hf"
    export_checkpoint(folder, out, format="hf")
    loaded = transformers.AutoModelForSequenceClassification.from_pretrained(
        out, local_files_only=True
    )
    assert loaded.config.num_labels == 3
    ids = torch.randint(0, _vocab(), (3, 9), generator=torch.Generator().manual_seed(2))
    model.eval()
    torch.testing.assert_close(_logits(loaded, ids), _logits(model.model, ids), rtol=0, atol=0)
    assert not (out / "tokenizer_config.json").exists()  # the run had no tokenizer


def _tamper(checkpoint, name, data):
    (checkpoint / name).write_bytes(data)
    manifest_path = checkpoint / "trainkit-manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][name] = {"size": len(data), "sha256": hash_file(checkpoint / name)}
    manifest_path.write_text(json.dumps(manifest))


def test_a_config_that_needs_code_is_refused(gpt2_run, tmp_path):
    folder, _ = gpt2_run
    copy = tmp_path / "copy"
    copy.mkdir()
    for file in (folder / "ep1-ba4").iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    config = json.loads((copy / "hf-config.json").read_text())
    config["architectures"] = ["os.system"]
    _tamper(copy, "hf-config.json", json.dumps(config).encode())
    with pytest.raises(CheckpointError, match=r"names the model class\(es\) \['os.system'\]"):
        export_checkpoint(copy, tmp_path / "x.onnx", format="onnx")
    config.update(architectures=["GPT2LMHeadModel"], model_type="evil")
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig"}
    _tamper(copy, "hf-config.json", json.dumps(config).encode())
    with pytest.raises(CheckpointError, match=r"without running code \(trust_remote_code"):
        export_checkpoint(copy, tmp_path / "y", format="hf")
    assert not (tmp_path / "y").exists()


def test_hf_files_are_confined_like_the_shards(gpt2_run, tmp_path):
    folder, _ = gpt2_run
    copy = tmp_path / "copy"
    copy.mkdir()
    for file in (folder / "ep1-ba4").iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    secret = tmp_path / "secret.json"
    secret.write_text((copy / "hf-config.json").read_text())
    (copy / "hf-config.json").unlink()
    (copy / "hf-config.json").symlink_to(secret)
    with pytest.raises(UnsafePathError, match=r"hf-config\.json is a symbolic link"):
        export_checkpoint(copy, tmp_path / "out", format="hf")


def test_formats_that_rebuild_the_model_need_its_config(tmp_path, capsys):
    from toy import blobs, loader, mlp

    model = mlp()
    folder = tmp_path / "ckpt"
    Trainer(
        model=model,
        train_dataloader=loader(blobs(32)),
        max_duration="1ep",
        callbacks=[Checkpointer(folder=str(folder))],
        progress_bar=False,
        device="cpu",
    ).fit()
    code = checkpoint_cli(["export", str(folder), "--format", "onnx", "--out", str(tmp_path / "m")])
    err = capsys.readouterr().err
    assert code == 1 and "carries no model config" in err and "trainkit.checkpoint.export(" in err
    assert checkpoint_cli(["export", str(folder)]) == 1
    assert "give OUT or --out OUT" in capsys.readouterr().err


def test_a_peft_checkpoint_exports_its_adapter_or_the_merged_model(tmp_path):
    peft = pytest.importorskip("peft")

    def base():
        torch.manual_seed(0)
        return _gpt2().model

    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True,
                           task_type="CAUSAL_LM", init_lora_weights=False)  # fmt: skip
    model = HuggingFaceModel(peft.get_peft_model(base(), lora))
    _train(model, _lm_batches(), tmp_path / "ckpt")
    names = set(verify_checkpoint(tmp_path / "ckpt").files)
    assert {"hf-config.json", "hf-adapter_config.json"} <= names
    model.eval()
    ids = torch.randint(0, _vocab(), (2, 7), generator=torch.Generator().manual_seed(4))
    expected = _logits(model.model, ids)

    adapter = tmp_path / "adapter"
    export_checkpoint(tmp_path / "ckpt", adapter, format="hf")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {
        p.name for p in adapter.iterdir()
    }
    assert not (adapter / "model.safetensors").exists()  # the adapter only, not the base
    reloaded = peft.PeftModel.from_pretrained(base(), adapter).eval()
    torch.testing.assert_close(_logits(reloaded, ids), expected)

    merged = tmp_path / "merged"
    argv = ["export", str(tmp_path / "ckpt"), "--format", "hf", "--merge-adapter", "--out"]
    assert checkpoint_cli([*argv, str(merged)]) == 0
    plain = transformers.AutoModelForCausalLM.from_pretrained(merged, local_files_only=True)
    assert not any("lora" in name for name in plain.state_dict())
    torch.testing.assert_close(_logits(plain, ids), expected, rtol=1e-5, atol=1e-5)
