"""A copy of ``trainkit train --print-config``'s output trains in a run directory of its own
(issue 52.1): the printed config leaves the run-dependent values unset."""

from pathlib import Path

import yaml

from trainkit.cli import main
from trainkit.cli._config import load_config

TINY = """\
model: {name: tiny_gpt2, n_layer: 1, n_head: 2, n_embd: 32, n_positions: 32}
data: {name: stdlib_text, seq_len: 32, batch_size: 8, max_bytes: 60000, eval_bytes: 4096}
"""


def test_a_copy_of_the_printed_config_writes_to_its_own_run_directory(tmp_path, capsys):
    assert main(["train", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "runs/default" not in out  # nothing pins the default run's folder
    printed = yaml.safe_load(out)
    assert printed["trainer"]["run_name"] is None
    assert "folder" not in (printed.get("checkpoint") or {})
    assert all(logger["name"] != "file" for logger in printed["loggers"])

    copy = tmp_path / "mine.yaml"
    copy.write_text(out.replace("n_layer: 2", "n_layer: 1"))
    config = load_config(copy)
    assert config.run_dir == Path("runs/mine") and config.trainer["run_name"] == "mine"
    plain = config.plain()
    if plain["checkpoint"] is not None:
        assert plain["checkpoint"]["folder"] == str(Path("runs/mine/checkpoints"))
    assert [c["folder"] for c in plain["loggers"] if c["name"] == "file"] in ([], ["runs/mine"])

    elsewhere = load_config(tmp_path / "mine.yaml", run_dir=tmp_path / "elsewhere")
    if elsewhere.checkpoint is not None:
        assert elsewhere.plain()["checkpoint"]["folder"] == str(tmp_path / "elsewhere/checkpoints")


def test_a_run_name_given_is_printed_and_the_run_record_keeps_every_value(tmp_path, capsys):
    assert main(["train", "--print-config", "--set", "trainer.run_name=exp7"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["trainer"]["run_name"] == "exp7"
    # The run's own record (config.yaml, to_yaml) keeps the values its directory gave.
    base = yaml.safe_load(TINY)
    config = load_config(None, base=base, run_dir=tmp_path / "r")
    recorded, portable = yaml.safe_load(config.to_yaml()), yaml.safe_load(config.to_yaml(True))
    assert recorded["trainer"]["run_name"] == "r" and portable["trainer"]["run_name"] is None
