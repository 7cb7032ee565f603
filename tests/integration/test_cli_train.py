"""``trainkit train`` with trainkit-loggers and trainkit-checkpoint installed.

The CLI finds the file logger and the checkpointer by entry point and uses them when they are
installed: metrics.jsonl and checkpoints/ in the run directory, resuming on a second run. The
CLI's own outputs are tested in tests/cli/test_train.py, which also runs without them.
"""

import json

import pytest

from trainkit.cli import main
from trainkit.cli._config import ConfigError, load_config
from trainkit.core import plugins

TINY = """\
model: {name: tiny_gpt2, n_layer: 1, n_head: 2, n_embd: 32, n_positions: 32}
data: {name: stdlib_text, seq_len: 32, batch_size: 8, max_bytes: 60000, eval_bytes: 4096}
optimizers: {name: AdamW, lr: 0.003}
schedulers: [{name: linear_with_warmup, t_warmup: 0.2dur}]
checkpoint: {interval: 4ba, keep: 2}
trainer: {max_duration: 8ba, eval_interval: 4ba, device: cpu, progress_bar: false}
"""


def test_module_factory_model(tmp_path):
    config = tmp_path / "factory.yaml"
    config.write_text(TINY.replace("name: tiny_gpt2", "name: trainkit.cli._default:tiny_gpt2"))
    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run_dir), "--max-duration", "2ba"]) == 0
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(line.get("step", 0) for line in lines) == 2
    assert any("loss/train/total" in line.get("metrics", line) for line in lines)


def test_running_again_resumes(tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run_dir), "--max-duration", "4ba"]) == 0
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "ep0-ba4"
    capsys.readouterr()
    assert main(["train", str(config), "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert out.count("resuming from") == 1 and "at batch 4" in out  # the Trainer's line only
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "ep0-ba8"


def test_a_run_of_another_model_refuses_the_run_directory(tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run_dir), "--max-duration", "4ba"]) == 0
    files = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    capsys.readouterr()

    edited = tmp_path / "edited.yaml"
    edited.write_text(TINY.replace("n_layer: 1", "n_layer: 2"))
    assert main(["train", str(edited), "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert f"{run_dir / 'checkpoints'} holds checkpoints of another model" in err
    assert "saved by run 'run'" in err and "--run-dir" in err and "overwrite=True" in err
    # config.yaml, metrics.jsonl and the checkpoints are the first run's, untouched.
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == files


# --- the checkpoint section is the Checkpointer's own config (needs trainkit-checkpoint) ---

BASE = TINY.split("optimizers:")[0]


def write(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_checkpoint_section_is_the_checkpointers_config(tmp_path):
    checkpointer = plugins.load("trainkit.callbacks", "checkpointer")
    config = load_config(write(tmp_path, BASE + "checkpoint: {keep: 5}\n"), run_dir=tmp_path)
    assert isinstance(config.checkpoint.config, checkpointer.config_class)
    assert config.checkpoint.config.keep == 5
    assert config.checkpoint.config.folder == str(tmp_path / "checkpoints")
    assert config.checkpoint.config.autoresume is True  # re-running a config resumes it
    assert load_config(write(tmp_path, BASE + "checkpoint: null\n")).checkpoint is None
    with pytest.raises(
        ConfigError, match=r"checkpoint\.keepp: unknown field .*did you mean 'keep'"
    ):
        load_config(write(tmp_path, BASE + "checkpoint: {keepp: 5}\n"))
    with pytest.raises(ConfigError, match=r"checkpoint\.name: the checkpoint section takes"):
        load_config(write(tmp_path, BASE + "checkpoint: {name: other}\n"))
