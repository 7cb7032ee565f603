"""Values that each section accepts but that do not fit together are refused before anything
is built or written (issue 52, finding 2)."""

from __future__ import annotations

import pytest

from trainkit.cli import main
from trainkit.cli._config import ConfigError, load_config

# The README's example as the new user ran it: seq_len 256 with tiny_gpt2's 128 positions.
README_YAML = """\
model: {name: tiny_gpt2, n_layer: 4, n_embd: 256}
data: {name: stdlib_text, seq_len: 256, batch_size: 32}
optimizers: {name: AdamW, lr: 3.0e-4, weight_decay: 0.1}
schedulers: [{name: cosine_with_warmup, t_warmup: 0.05dur}]
checkpoint: null
trainer: {max_duration: 5000ba, eval_interval: 500ba}
"""


def write(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_a_sequence_longer_than_the_model_positions_fails_before_the_run_directory(
    tmp_path, capsys
):
    run_dir = tmp_path / "run"
    assert main(["train", str(write(tmp_path, README_YAML)), "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert (
        "data.seq_len: 256 is longer than the model takes: model.n_positions 128 (tiny_gpt2's "
        "default). Set model.n_positions to at least 256, or data.seq_len to at most 128"
    ) in err
    assert "Traceback" not in err
    assert not run_dir.exists()


def test_positions_given_in_the_file_are_checked_and_enough_passes(tmp_path):
    text = README_YAML.replace("n_embd: 256}", "n_embd: 256, n_positions: 200}")
    with pytest.raises(ConfigError, match=r"model\.n_positions 200\. Set model\.n_positions"):
        load_config(write(tmp_path, text))
    fitting = README_YAML.replace("n_embd: 256}", "n_embd: 256, n_positions: 256}")
    assert load_config(write(tmp_path, fitting)).components["data"].options["seq_len"] == 256


def test_a_transformers_config_is_checked_with_its_own_defaults(tmp_path):
    text = (
        "model: {name: huggingface, config: {model_type: gpt2, n_layer: 1, n_embd: 32, "
        "n_head: 2, vocab_size: 100}}\n"
        "data: {name: stdlib_text, seq_len: 2048}\n"
        "trainer: {max_duration: 10ba}\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    message = str(err.value)
    assert (
        "data.seq_len: 2048 is longer than the model takes: model.config.n_positions 1024 "
        "(the default of transformers' gpt2 config)"
    ) in message
    assert (
        "model.config.vocab_size: 100 is smaller than the 256 token ids the data (stdlib_text) "
        "holds; set it to at least 256"
    ) in message


def test_a_microbatch_larger_than_the_batch_is_refused(tmp_path):
    text = (
        "model: {name: tiny_gpt2, n_positions: 64}\n"
        "data: {name: stdlib_text, seq_len: 64}\n"  # batch_size: stdlib_text's default, 16
        "trainer: {max_duration: 10ba, device_train_microbatch_size: 32}\n"
    )
    with pytest.raises(
        ConfigError,
        match=r"trainer\.device_train_microbatch_size: 32 is larger than the batch it splits: "
        r"data\.batch_size 16 \(stdlib_text's default\)\. Use a size from 1 to 16, or 'auto'",
    ):
        load_config(write(tmp_path, text))


def test_an_interval_longer_than_the_run_is_a_note(tmp_path):
    text = (
        "model: {name: tiny_gpt2}\ndata: {name: stdlib_text}\n"
        "trainer: {max_duration: 100ba, eval_interval: 500ba}\n"
    )
    config = load_config(write(tmp_path, text), ["checkpoint=null"])
    assert config.notes == [
        "trainer.eval_interval 500ba is longer than trainer.max_duration 100ba, so the run "
        "evaluates only at its end"
    ]
