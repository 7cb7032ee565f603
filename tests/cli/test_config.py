"""Config validation: field paths, values received, what is accepted; overrides."""

import pytest
import yaml

from trainkit.cli import main
from trainkit.cli._config import ConfigError, apply_overrides, load_config


def write(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_defaults_and_overrides(tmp_path):
    path = write(tmp_path, "trainer: {max_duration: 3ep}\nalgorithms: []\n")
    config = load_config(
        path, ["trainer.max_duration=2ep", "trainer.precision=amp_bf16", "model.n_layer=1"]
    )
    assert config.trainer.max_duration == "2ep"
    assert config.trainer.precision == "amp_bf16"
    assert config.model.name == "tiny_gpt2" and config.model.kwargs == {"n_layer": 1}


def test_override_into_a_list():
    raw = {"schedulers": [{"name": "linear", "alpha_f": 0.5}]}
    assert apply_overrides(raw, ["schedulers.0.alpha_f=0.1"])["schedulers"][0]["alpha_f"] == 0.1
    assert raw["schedulers"][0]["alpha_f"] == 0.5  # the input is not changed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "trainer: {max_duration: 10 epochs}",
            r"trainer\.max_duration: duration '10 epochs' is not a duration; use .*'10ep'.* \(got '10 epochs'\)",
        ),
        ("trainer: {max_epochs: 3}", r"trainer\.max_epochs: unknown field \(got 3\)"),
        (
            "algorithms: [{name: warp_speed}]",
            r"algorithms\.0: unknown name 'warp_speed'; installed in trainkit\.algorithms: .*module:factory",
        ),
        (
            "loggers: [{name: carrier_pigeon}]",
            r"loggers\.0: unknown name 'carrier_pigeon'; installed in trainkit\.loggers: .*progress",
        ),
        (
            "model: {name: resnet9000}",
            r"model: unknown name 'resnet9000'; installed in trainkit\.models: tiny_gpt2",
        ),
        ("optimizer: {lr: -1}", r"optimizer\.lr: Input should be greater than 0 \(got -1\)"),
        ("- just\n- a list", r"must hold a mapping of sections"),
    ],
)
def test_validation_errors(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text))


def test_bad_set_syntax():
    with pytest.raises(ConfigError, match=r"--set 'trainer\.max_duration' is not key=value"):
        load_config(None, ["trainer.max_duration"])


def test_missing_config_file_is_a_clear_cli_error(tmp_path, capsys):
    assert main(["train", str(tmp_path / "nope.yaml")]) == 2
    assert "config file" in capsys.readouterr().err


def test_print_config_shows_the_resolved_default(capsys):
    assert main(["train", "--print-config", "--max-duration", "7ba"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["name"] == "tiny_gpt2"
    assert printed["trainer"]["max_duration"] == "7ba"


def test_bad_component_fields_list_the_accepted_ones(tmp_path, capsys):
    path = write(tmp_path, "model: {name: tiny_gpt2, layers: 3}\ncheckpoint: null\n")
    assert main(["train", str(path), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "model (tiny_gpt2): got an unexpected keyword argument 'layers'" in err
    assert "accepted fields: n_layer, n_head, n_embd, n_positions" in err
