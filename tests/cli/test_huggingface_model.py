"""``model: {name: huggingface, config: {...}}``: any transformers architecture from its
config, trained by ``trainkit train`` (trainkit-trainer's `HuggingFaceModel.from_config`,
found by entry point)."""

import pytest

from trainkit.cli import _train, main
from trainkit.cli._config import ConfigError, load_config

LLAMA = """\
model:
  name: huggingface
  config: {model_type: llama, vocab_size: 256, hidden_size: 32, intermediate_size: 64,
           num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1,
           max_position_embeddings: 64}
data: {name: stdlib_text, seq_len: 32, batch_size: 4, max_bytes: 20000, eval_bytes: 2048}
optimizers: {name: AdamW, lr: 0.003}
trainer: {max_duration: 3ba, device: cpu, progress_bar: false}
"""


def test_a_llama_from_its_config_trains(tmp_path, monkeypatch):
    config = tmp_path / "llama.yaml"
    config.write_text(LLAMA)
    trained = []
    fit = _train.trainer_class().fit

    def recording_fit(trainer, *args, **kwargs):
        trained.append(trainer)
        return fit(trainer, *args, **kwargs)

    monkeypatch.setattr(_train.trainer_class(), "fit", recording_fit)
    assert main(["train", str(config), "--run-dir", str(tmp_path / "run")]) == 0
    (trainer,) = trained
    model = trainer.state.model
    assert type(model).__name__ == "HuggingFaceModel"
    assert type(model.model).__name__ == "LlamaForCausalLM"
    assert model.model.config.num_key_value_heads == 1
    assert trainer.state.timestamp.batch == 3


def test_a_config_without_model_type_is_refused_with_what_it_needs(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(LLAMA.replace("model_type: llama, ", ""))
    with pytest.raises((ConfigError, ValueError), match="needs 'model_type'"):
        from trainkit.cli._build import build_run

        build_run(load_config(config, []))
