"""``trainkit train`` end to end on a tiny config, in process."""

import json

from trainkit.cli import main

TINY = """\
model: {name: tiny_gpt2, n_layer: 1, n_head: 2, n_embd: 32, n_positions: 32}
data: {name: stdlib_text, seq_len: 32, batch_size: 8, max_bytes: 60000, eval_bytes: 4096}
optimizer: {name: AdamW, lr: 0.003}
schedulers: [{name: linear_with_warmup, t_warmup: 0.2dur}]
checkpoint: {interval: 4ba, keep: 2}
trainer: {max_duration: 8ba, eval_interval: 4ba, device: cpu, progress_bar: false}
"""


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
    losses = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("loss/train/total" in entry.get("metrics", entry) for entry in losses)


def test_train_rejects_bad_optimizer(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text(TINY.replace("name: AdamW", "name: Adamm"))
    assert main(["train", str(config), "--run-dir", str(tmp_path / "run")]) == 2
    assert "optimizer.name: 'Adamm' is not a torch optimizer; use one of" in capsys.readouterr().err


def test_module_factory_model(tmp_path):
    config = tmp_path / "factory.yaml"
    config.write_text(TINY.replace("name: tiny_gpt2", "name: trainkit.cli._default:tiny_gpt2"))
    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run_dir), "--max-duration", "2ba"]) == 0
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(line.get("step", 0) for line in lines) == 2


def test_running_again_resumes(tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run_dir), "--max-duration", "4ba"]) == 0
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "ep0-ba4"
    capsys.readouterr()
    assert main(["train", str(config), "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "resuming from" in out and "at batch 4" in out
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "ep0-ba8"
