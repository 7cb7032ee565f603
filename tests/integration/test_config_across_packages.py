"""Cross-section checks of a config that name components of other packages: ALiBi replaces
the model's positions, an export callback traces at its own length (issue 52, finding 2)."""

import pytest

from trainkit.cli._config import ConfigError, load_config

LONG = """\
model: {name: tiny_gpt2, n_layer: 1, n_head: 2, n_embd: 32}
data: {name: stdlib_text, seq_len: 256, batch_size: 8}
checkpoint: null
trainer: {max_duration: 2ba}
"""


def write(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_with_alibi_its_max_sequence_length_bounds_the_data(tmp_path):
    with_alibi = LONG + "algorithms: [{name: alibi}]\n"  # max_sequence_length 8192
    assert load_config(write(tmp_path, with_alibi)).components["algorithms"][0].name == "alibi"
    short = LONG + "algorithms: [{name: alibi, max_sequence_length: 200}]\n"
    with pytest.raises(
        ConfigError,
        match=r"data\.seq_len: 256 is longer than the model takes: "
        r"algorithms\.0\.max_sequence_length 200\. Set algorithms\.0\.max_sequence_length to "
        r"at least 256",
    ):
        load_config(write(tmp_path, short))


def test_an_export_longer_than_the_model_positions_is_refused(tmp_path):
    text = LONG.replace("seq_len: 256", "seq_len: 64") + (
        "callbacks: [{name: export_on_fit_end, folder: out, seq_len: 512}]\n"
    )
    with pytest.raises(
        ConfigError,
        match=r"callbacks\.0\.seq_len: 512 is longer than the model takes: model\.n_positions "
        r"128 \(tiny_gpt2's default\); use at most 128",
    ):
        load_config(write(tmp_path, text))


def test_generated_text_must_fit_in_the_model_positions(tmp_path):
    text = LONG.replace("seq_len: 256", "seq_len: 64") + (
        "callbacks: [{name: generate, prompts: ['def '], max_new_tokens: 128}]\n"
    )
    with pytest.raises(
        ConfigError,
        match=r"callbacks\.0\.max_new_tokens: 128 tokens after a prompt do not fit in the model's "
        r"positions: model\.n_positions 128 \(tiny_gpt2's default\); use at most 127 minus",
    ):
        load_config(write(tmp_path, text))
    fitting = text.replace("max_new_tokens: 128", "max_new_tokens: 100")
    assert load_config(write(tmp_path, fitting)).components["callbacks"][0].name == "generate"
