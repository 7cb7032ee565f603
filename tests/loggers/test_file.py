"""FileLogger: JSON lines per run, buffered, readable while training, errors that help."""

import json
import warnings
from pathlib import Path

import pytest
import torch

from toy import blobs, loader, mlp
from trainkit.core import Callback, CallbackError
from trainkit.loggers import FileLogger, FileLoggerConfig, read_jsonl
from trainkit.trainer import Trainer


def _trainer(tmp_path, *loggers, callbacks=(), duration="2ep", run_name="demo", **kwargs):
    return Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(64)),
        eval_dataloader=loader(blobs(32), shuffle=False),
        max_duration=duration,
        device="cpu",
        progress_bar=False,
        run_name=run_name,
        seed=0,
        loggers=list(loggers),
        callbacks=list(callbacks),
        **kwargs,
    )


def test_one_file_per_run_with_hyperparameters_and_every_step(tmp_path):
    file = FileLogger(folder=tmp_path / "{run_name}")
    with _trainer(tmp_path, file) as trainer:
        trainer.fit()
    assert file.path == tmp_path / "demo" / "metrics.jsonl"
    records = read_jsonl(file.path)
    assert records[0]["hyperparameters"]["run_name"] == "demo"
    assert records[0]["hyperparameters"]["max_duration"] == "2ep"
    # Nested as logged: each component as {"name": ..., **its config}.
    assert records[0]["hyperparameters"]["loggers"] == [
        {
            "name": "FileLogger",
            "flush_interval": 5.0,
            "rank_zero_only": True,
            "folder": str(tmp_path / "{run_name}"),
            "filename": "metrics.jsonl",
        }
    ]
    metrics = [r for r in records if "metrics" in r]
    losses = [
        (r["step"], r["metrics"]["loss/train/total"])
        for r in metrics
        if "loss/train/total" in r["metrics"]
    ]
    assert [step for step, _ in losses] == list(range(1, 9))
    assert all(isinstance(loss, float) for _, loss in losses)
    evals = [r for r in metrics if "metrics/eval/accuracy" in r["metrics"]]
    assert [r["step"] for r in evals] == [4, 8]
    assert all(r["time"] > 0 for r in records)


def test_nothing_is_written_per_step_until_the_interval_or_the_end_of_fit(tmp_path):
    file = FileLogger(folder=tmp_path / "{run_name}", flush_interval=3600)
    lines_seen = []

    class Peek(Callback):
        def batch_end(self, state, logger):
            lines_seen.append(len(file.path.read_text().splitlines()))

    trainer = _trainer(tmp_path, file, callbacks=[Peek()])
    trainer.fit()
    assert set(lines_seen) == {1}  # only the hyperparameters, written at the start
    assert len(read_jsonl(file.path)) > 8  # everything is there once fit returns
    trainer.close()


def test_readable_while_training_runs(tmp_path):
    file = FileLogger(folder=tmp_path / "{run_name}", flush_interval=0)
    steps_seen = []

    class Peek(Callback):
        def batch_end(self, state, logger):
            records = read_jsonl(file.path)
            steps_seen.append(max(r.get("step", 0) for r in records))

    with _trainer(tmp_path, file, callbacks=[Peek()], duration="3ba") as trainer:
        trainer.fit()
    assert steps_seen == [1, 2, 3]


def test_values_stay_tensors_until_written(tmp_path, sync_counter):
    file = FileLogger(folder=tmp_path, flush_interval=3600)
    loss = torch.tensor(0.5)
    with sync_counter() as counter:
        for step in range(100):
            file.log_metrics({"loss": loss, "lr": 0.1}, step)
    assert counter.count == 0
    file.close()
    records = read_jsonl(file.path)
    assert len(records) == 100
    assert records[-1] == {
        "step": 99,
        "time": records[-1]["time"],
        "metrics": {"loss": 0.5, "lr": 0.1},
    }


def test_a_resumed_run_appends_to_its_file(tmp_path):
    for _ in range(2):
        with _trainer(
            tmp_path, FileLogger(folder=tmp_path / "{run_name}"), duration="2ba"
        ) as trainer:
            trainer.fit()
    records = read_jsonl(tmp_path / "demo" / "metrics.jsonl")
    assert sum("hyperparameters" in r for r in records) == 2


def test_non_finite_and_non_numeric_values_are_kept(tmp_path):
    file = FileLogger(folder=tmp_path)
    file.log_metrics({"nan": torch.tensor(float("nan")), "n": torch.tensor(3), "s": "text"}, 1)
    file.close()
    (record,) = read_jsonl(file.path)
    assert record["metrics"]["n"] == 3 and record["metrics"]["s"] == "text"
    assert record["metrics"]["nan"] != record["metrics"]["nan"]  # NaN


def test_an_unwritable_folder_fails_before_training(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(CallbackError, match="FileLogger cannot write") as err:
        _trainer(tmp_path, FileLogger(folder=blocker / "logs"))
    assert "a-file/logs/metrics.jsonl" in str(err.value)


def test_a_bad_folder_template_says_what_is_accepted(tmp_path):
    with pytest.raises(CallbackError, match=r"may contain '\{run_name\}' and '\{rank\}'"):
        _trainer(tmp_path, FileLogger(folder=tmp_path / "{run}"))


def test_a_disk_that_fills_up_mid_run_does_not_stop_training(tmp_path):
    file = FileLogger(folder=tmp_path / "{run_name}", flush_interval=0)

    class DiskFull(Callback):
        def batch_end(self, state, logger):
            if state.timestamp.batch == 2:

                def fail(text):
                    raise OSError(28, "No space left on device")

                file._file.write = fail

    trainer = _trainer(tmp_path, file, callbacks=[DiskFull()], duration="6ba")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit()
        trainer.close()
    assert trainer.state.timestamp.batch == 6
    messages = [str(w.message) for w in caught if "No space left" in str(w.message)]
    assert len(messages) == 1
    assert "FileLogger.log_metrics failed" in messages[0]


def test_upload_file_copies_into_the_run_folder(tmp_path):
    source = tmp_path / "weights.bin"
    source.write_bytes(b"abc")
    file = FileLogger(folder=tmp_path / "run")
    file.upload_file("artifacts/weights.bin", source)
    assert (tmp_path / "run" / "artifacts" / "weights.bin").read_bytes() == b"abc"
    with pytest.raises(FileExistsError, match="overwrite=True"):
        file.upload_file("artifacts/weights.bin", source)
    file.close()


def test_only_rank_zero_writes_by_default(tmp_path, monkeypatch):
    from trainkit.core import dist

    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    file = FileLogger(folder=tmp_path / "r", flush_interval=0)
    file.log_hyperparameters({"a": 1})
    file.log_metrics({"x": 1.0}, 1)
    file.close()
    assert not (tmp_path / "r").exists()
    every = FileLogger(folder=tmp_path / "r", filename="metrics-{rank}.jsonl", rank_zero_only=False)
    every.log_metrics({"x": 1.0}, 1)
    every.close()
    assert json.loads((tmp_path / "r" / "metrics-1.jsonl").read_text())["metrics"] == {"x": 1.0}


def test_bad_flush_interval():
    with pytest.raises(ValueError, match="flush_interval -1 is not valid; use seconds >= 0"):
        FileLogger(flush_interval=-1)
    with pytest.raises(ValueError, match="flush_interval -1 is not valid"):
        FileLoggerConfig(flush_interval=-1)  # checked by the config, before any logger exists


def test_the_config_holds_the_folder_as_text(tmp_path):
    config = FileLoggerConfig(folder=tmp_path / "{run_name}", flush_interval=0)
    assert config.folder == str(tmp_path / "{run_name}")
    file = FileLogger(config, filename="m.jsonl")  # keywords override the config's fields
    assert file.config == FileLoggerConfig(
        folder=str(tmp_path / "{run_name}"), filename="m.jsonl", flush_interval=0
    )
    assert file.path == tmp_path / "run" / "m.jsonl"


def test_hyperparameters_logged_before_the_run_starts_are_written_once_it_does(tmp_path):
    file = FileLogger(folder=tmp_path / "run")
    file.log_hyperparameters({"lr": 0.1})
    assert not (tmp_path / "run").exists()  # no run, no folder yet
    file.close()
    assert read_jsonl(tmp_path / "run" / "metrics.jsonl")[0]["hyperparameters"] == {"lr": 0.1}


def test_nested_hyperparameters_stay_nested(tmp_path):
    file = FileLogger(folder=tmp_path / "run")
    nested = {
        "algorithms": [{"name": "EMA", "half_life": "100ba"}, {"name": "MixUp", "alpha": 0.2}],
        "optimizers": {"name": "AdamW", "betas": [0.9, 0.95]},
        "callbacks": [],
    }
    file.log_hyperparameters(nested)
    file.close()
    assert read_jsonl(tmp_path / "run" / "metrics.jsonl")[0]["hyperparameters"] == nested


def test_a_filename_with_its_own_folder_is_not_put_inside_the_folder_again(tmp_path, monkeypatch):
    # Composer's FileLogger(filename=...) is a path of its own; it used to land in
    # runs/{run_name}/runs/port/log.txt (or runs/port/runs/port/log.txt).
    monkeypatch.chdir(tmp_path)
    alone = FileLogger(filename="runs/port/log.txt")
    repeated = FileLogger(folder="runs/port", filename="runs/port/log2.txt")
    with _trainer(tmp_path, alone, repeated, run_name="port", duration="1ep") as trainer:
        trainer.fit()
    assert alone.path == repeated.path.with_name("log.txt") == Path("runs/port/log.txt")
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("log*.txt")) == [
        "runs/port/log.txt",
        "runs/port/log2.txt",
    ]
    assert read_jsonl(tmp_path / "runs/port/log.txt")[0]["hyperparameters"]["run_name"] == "port"


def test_a_filename_outside_the_given_folder_is_refused_with_both_spellings():
    with pytest.raises(ValueError, match=r"folder='logs', filename='m.jsonl'.*filename='logs/m"):
        FileLogger(folder="runs/a", filename="logs/m.jsonl")


def test_composer_file_logger_arguments_are_answered():
    with pytest.raises(
        TypeError, match=r"capture_stdout: not offered.*buffer_size: use flush_interval"
    ):
        FileLogger(filename="log.txt", capture_stdout=True, buffer_size=1)
