"""``trainer: {compile: ...}`` in a ``trainkit train`` config reaches the Trainer."""

import pytest

from trainkit.cli._build import build_run
from trainkit.cli._config import ConfigError, load_config
from trainkit.trainer import Trainer

TINY = """\
model: {name: tiny_gpt2, n_layer: 1, n_head: 2, n_embd: 32, n_positions: 32}
data: {name: stdlib_text, seq_len: 32, batch_size: 8, max_bytes: 60000, eval_bytes: 4096}
trainer: {max_duration: 2ba, eval_interval: 2ba, eval_subset_num_batches: 1, device: cpu,
          progress_bar: false, COMPILE}
"""


def _config(tmp_path, compile_setting: str, overrides=()):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY.replace("COMPILE", compile_setting))
    return load_config(path, ["checkpoint=null", *overrides], run_dir=tmp_path / "run")


def test_compile_from_yaml_compiles_the_model(tmp_path):
    # Training compiled is tested in tests/trainer/test_compile.py (a GPT-2 compiles slowly).
    config = _config(tmp_path, "compile: {backend: aot_eager, dynamic: false}")
    assert config.trainer["compile"] == {"backend": "aot_eager", "dynamic": False}
    trainer = Trainer(build_run(config).config)
    trainer.close()
    assert trainer.state.model._compiled_call_impl is not None
    assert trainer.hyperparameters()["compile"] == {"backend": "aot_eager", "dynamic": False}


def test_compile_true_from_yaml_and_from_an_override(tmp_path):
    assert _config(tmp_path, "compile: true").trainer["compile"] is True
    overridden = _config(tmp_path, "seed: 1", ["trainer.compile=true"])
    assert overridden.trainer["compile"] is True
    assert _config(tmp_path, "seed: 1").trainer["compile"] is False  # the default


def test_a_bad_compile_option_in_yaml_names_the_field_and_what_is_accepted(tmp_path):
    with pytest.raises(ConfigError) as info:
        _config(tmp_path, "compile: {mode: max-autotune, dynamc: true}")
    message = str(info.value)
    assert "trainer.compile" in message and "'dynamc' is not a torch.compile keyword" in message
    assert "accepted: " in message and "dynamic" in message
