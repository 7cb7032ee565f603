"""Names looked up in a config: suggestions, short messages, factories beside the config,
and a model without a loss (issue 52, findings 6 and 10)."""

from __future__ import annotations

import sys

import pytest

from trainkit.cli import main
from trainkit.cli._build import build_run
from trainkit.cli._config import ConfigError, load_config
from trainkit.core import plugins

DATA = "data: {name: stdlib_text, seq_len: 32, batch_size: 8, max_bytes: 60000, eval_bytes: 4096}\n"
FACTORIES = '''\
import torch
from torch import nn


def build(width: int = 4):
    """A network without a loss."""
    return nn.Linear(width, 2)
'''


@pytest.fixture
def import_state(monkeypatch):
    """Restore the import path and forget the modules a test imports from its folder."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("beside_"):
            del sys.modules[name]


def write(folder, text, name="config.yaml"):
    path = folder / name
    path.write_text(text)
    return path


def test_a_misspelled_trainer_field_is_one_line_with_the_suggestion(tmp_path):
    text = "model: {name: tiny_gpt2}\n" + DATA + "trainer: {max_duratoin: 2ba}\n"
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    (line,) = [ln for ln in str(err.value).splitlines() if "max_duratoin" in ln]
    assert line.strip() == (
        "trainer.max_duratoin: unknown field (got '2ba'); did you mean 'max_duration'? "
        "(`trainkit train --print-config` shows all 36 fields of the trainer with their meaning)"
    )
    assert len(str(err.value).splitlines()) == 2


def test_a_misspelled_component_name_gets_a_suggestion_not_every_name(tmp_path):
    text = "model: {name: tiny_gtp2}\n" + DATA
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    assert (
        "model: unknown name 'tiny_gtp2'; did you mean 'tiny_gpt2'? (`trainkit plugins` lists "
        "the " in str(err.value)
    )
    assert "huggingface" not in str(err.value)


def test_loading_an_entry_point_by_a_misspelled_name_suggests_the_installed_one():
    with pytest.raises(LookupError, match=r"named 'tiny_gtp2'; did you mean 'tiny_gpt2'\?"):
        plugins.load("trainkit.models", "tiny_gtp2")


def test_a_factory_beside_the_config_is_found_without_pythonpath(tmp_path, import_state):
    folder = tmp_path / "project"
    folder.mkdir()
    write(folder, FACTORIES.replace("nn.Linear", "nn.Bilinear"), "beside_factories.py")
    config = load_config(
        write(folder, "model: {name: 'beside_factories:build', width: 3}\n" + DATA)
    )
    assert config.components["model"].target.__module__ == "beside_factories"
    assert config.components["model"].options == {"width": 3}


def test_a_factory_found_nowhere_says_how_to_make_it_importable(tmp_path, import_state):
    text = "model: {name: 'beside_nothing:build'}\n" + DATA
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    message = str(err.value)
    assert "cannot import 'beside_nothing:build': there is no module 'beside_nothing' beside " in (
        message
    )
    assert "Put beside_nothing.py beside the config file" in message
    assert "PYTHONPATH=" in message


def test_a_model_without_a_loss_is_one_paragraph(tmp_path, import_state, capsys):
    write(tmp_path, FACTORIES, "beside_models.py")
    text = "model: {name: 'beside_models:build'}\n" + DATA + "checkpoint: null\n"
    config = load_config(write(tmp_path, text), ["trainer.max_duration=1ba"])
    with pytest.raises(ConfigError) as err:
        build_run(config)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        "model (beside_models:build) returned a Linear (a torch module without a "
        "loss(outputs, batch) method), but the Trainer needs a model that computes its own loss"
    )
    assert "Classifier(network, num_classes=...)" in message
    path = str(tmp_path / "config.yaml")
    assert main(["train", path, "--run-dir", str(tmp_path / "run"), "--max-duration", "1ba"]) == 2
    err_text = capsys.readouterr().err
    assert "Traceback" not in err_text and "returned a Linear" in err_text
