"""ConsoleLogger prints at its interval on rank 0; InMemoryLogger keeps the history."""

import io

import pytest
import torch

from toy import blobs, loader, mlp
from trainkit.loggers import ConsoleLogger, InMemoryLogger
from trainkit.trainer import Trainer


def _fit(*loggers, duration="2ep", **kwargs):
    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(64)),
        eval_dataloader=loader(blobs(32), shuffle=False),
        max_duration=duration,
        device="cpu",
        progress_bar=False,
        seed=0,
        loggers=list(loggers),
        **kwargs,
    )
    trainer.fit()
    trainer.close()
    return trainer


def test_console_prints_every_interval_and_after_each_eval():
    out = io.StringIO()
    _fit(ConsoleLogger(interval="3ba", stream=out))
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[hyperparameters] model: Classifier  ")
    assert "  max_duration: 2ep  " in lines[0] and "  run_name: run-" in lines[0]
    # Nested hyperparameters (the components' configs) are printed as dotted keys.
    assert "  loggers.0.name: ConsoleLogger  loggers.0.interval: 3ba  " in lines[0]
    train = [line for line in lines if line.startswith("[epoch")]
    # Batches 3 and 6 cross the interval; batch 8 is the last one.
    assert [line.split("]")[0] for line in train] == [
        "[epoch 0 batch 3/4",
        "[epoch 1 batch 2/4",
        "[epoch 1 batch 4/4",
    ]
    assert all("loss/train/total: " in line for line in train)
    evals = [line for line in lines if line.startswith("[eval at batch")]
    assert [line.split("]")[0] for line in evals] == ["[eval at batch 4", "[eval at batch 8"]
    assert "metrics/eval/accuracy: " in evals[0] and "loss/train" not in evals[0]


def test_console_epoch_interval():
    out = io.StringIO()
    _fit(ConsoleLogger(interval="1ep", stream=out, print_hyperparameters=False))
    train = [line for line in out.getvalue().splitlines() if not line.startswith("[eval")]
    assert [line.split("]")[0] for line in train] == ["[end of epoch 0", "[end of epoch 1"]


def test_console_is_silent_on_other_ranks(monkeypatch):
    from trainkit.core import dist

    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    out = io.StringIO()
    _fit(ConsoleLogger(interval="1ba", stream=out), duration="2ba")
    assert out.getvalue() == ""


def test_the_trainers_log_to_console_prints_at_its_interval():
    # Composer's Trainer(log_to_console=True, console_log_interval=...): a ConsoleLogger
    # the Trainer adds itself, last among the destinations.
    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs()),  # 8 batches of 16
        max_duration="8ba",
        device="cpu",
        progress_bar=False,
        seed=7,
        log_to_console=True,
        console_log_interval="3ba",
    )
    console = trainer.logger.destinations[-1]
    assert isinstance(console, ConsoleLogger)
    console.stream = io.StringIO()
    trainer.fit()
    lines = [line for line in console.stream.getvalue().splitlines() if "loss/train" in line]
    assert [line.split("]")[0] for line in lines] == [
        "[epoch 0 batch 3/8",
        "[epoch 0 batch 6/8",
        "[epoch 0 batch 8/8",  # and always at the last batch
    ]


def test_console_rejects_a_bad_interval():
    with pytest.raises(ValueError, match="is not a duration"):
        ConsoleLogger(interval="every batch")


def test_console_prints_nested_hyperparameters_as_dotted_keys():
    out = io.StringIO()
    ConsoleLogger(stream=out).log_hyperparameters(
        {"lr": 0.1, "algorithms": [{"name": "EMA", "half_life": "100ba"}], "tags": []}
    )
    assert out.getvalue() == (
        "[hyperparameters] lr: 0.1  algorithms.0.name: EMA  algorithms.0.half_life: 100ba  "
        "tags: []\n"
    )


def test_in_memory_keeps_latest_and_history():
    memory = InMemoryLogger()
    _fit(memory, duration="3ba")
    assert [step for step, _ in memory.history("loss/train/total")] == [1, 2, 3]
    assert all(isinstance(value, float) for _, value in memory.history("loss/train/total"))
    assert memory.latest["loss/train/total"] == memory.history("loss/train/total")[-1][1]
    assert memory.hyperparameters["max_duration"] == "3ba"
    # Kept nested, as the Trainer logs them: components as {"name": ..., **fields}.
    assert memory.hyperparameters["loggers"] == [{"name": "InMemoryLogger"}]
    assert memory.hyperparameters["optimizers"][0]["name"] == "AdamW"
    assert "metrics/eval/accuracy" in memory.keys
    with pytest.raises(KeyError, match="no metric 'nope' was logged; logged: "):
        memory.history("nope")


def test_in_memory_does_not_read_values_when_logging(sync_counter):
    memory = InMemoryLogger()
    value = torch.tensor(2.0, requires_grad=True) * 1
    with sync_counter() as counter:
        memory.log_metrics({"x": value, "y": 3}, step=7)
    assert counter.count == 0
    with sync_counter() as reading:
        assert memory.latest == {"x": 2.0, "y": 3}
    assert reading.count == 1  # the counter does see reads: this one is where it belongs
    memory.log_images("samples", torch.zeros(2, 3, 4, 4), step=7)
    assert memory.images[0][:2] == ("samples", 7)
