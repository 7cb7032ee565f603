"""``trainkit train`` end to end on a tiny config, in process.

These run with or without trainkit-loggers and trainkit-checkpoint; what they add to a run
(metrics.jsonl, resuming) is tested in tests/integration/test_cli_train.py.
"""

import pytest

from trainkit.cli import main
from trainkit.cli._build import build_run
from trainkit.cli._config import ConfigError, load_config
from trainkit.core import plugins
from trainkit.trainer import Trainer

TINY = """\
model: {name: tiny_gpt2, n_layer: 1, n_head: 2, n_embd: 32, n_positions: 32}
data: {name: stdlib_text, seq_len: 32, batch_size: 8, max_bytes: 60000, eval_bytes: 4096}
optimizers: {name: AdamW, lr: 0.003}
schedulers: [{name: linear_with_warmup, t_warmup: 0.2dur}]
checkpoint: {interval: 4ba, keep: 2}
trainer: {max_duration: 8ba, eval_interval: 4ba, device: cpu, progress_bar: false}
"""
has_checkpoint = "checkpointer" in plugins.available("trainkit.callbacks")


def test_train_writes_the_run_directory(tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "final evaluation: metrics/eval/cross_entropy:" in out
    assert "sample:\ndef " in out
    assert (run_dir / "config.yaml").is_file()
    assert (run_dir / "sample.txt").read_text().startswith("def ")
    if not has_checkpoint:
        assert "note: trainkit-checkpoint is not installed" in out


def test_train_rejects_bad_optimizer(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text(TINY.replace("name: AdamW", "name: Adamm"))
    assert main(["train", str(config), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "optimizers: unknown name 'Adamm'; did you mean 'Adam'? (`trainkit plugins`" in err
    assert "module:factory" in err


def test_optimizer_values_are_checked_by_the_optimizer_and_named(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(TINY.replace("lr: 0.003", "lr: -1, weight_decay: 0.1"))
    config = load_config(path, ["checkpoint=null"], run_dir=tmp_path / "run")
    with pytest.raises(ConfigError, match=r"^optimizers\.lr: AdamW: Invalid learning rate: -1"):
        build_run(config)


def test_the_built_trainer_config_holds_every_section(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY.replace("optimizers: {", "optimizers: [{").replace("0.003}", "0.003}]"))
    config = load_config(path, ["checkpoint=null", "trainer.seed=5"], run_dir=tmp_path / "run")
    run = build_run(config)
    trainer_config = run.config
    assert trainer_config.seed == 5 and trainer_config.run_name == "run"
    assert [type(o).__name__ for o in trainer_config.optimizers] == ["AdamW"]
    assert trainer_config.optimizers[0].defaults["lr"] == 0.003
    (schedule,) = trainer_config.schedulers
    assert schedule.config.t_warmup == "0.2dur"
    assert trainer_config.eval_dataloader is not None and run.checkpointer is None
    trainer = Trainer(trainer_config)
    hyperparameters = trainer.hyperparameters()
    trainer.close()
    assert hyperparameters["schedulers"][0]["t_warmup"] == "0.2dur"
    assert hyperparameters["optimizers"][0]["lr"] == 0.003
    assert hyperparameters["seed"] == 5
