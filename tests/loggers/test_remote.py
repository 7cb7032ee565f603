"""wandb (offline), TensorBoard and MLflow (local file store), read back with their own tools."""

import builtins
import json
import shutil
import struct
import sys
import time
import warnings
from pathlib import Path

import pytest

from toy import blobs, loader, mlp
from trainkit.loggers import (
    CometLogger,
    MLflowLogger,
    MLflowLoggerConfig,
    NeptuneLogger,
    TensorBoardLogger,
    WandBLogger,
    WandBLoggerConfig,
)
from trainkit.trainer import Trainer


def _fit(*loggers, run_name="remote", duration="6ba"):
    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(64)),
        eval_dataloader=loader(blobs(32), shuffle=False),
        eval_interval="3ba",
        max_duration=duration,
        device="cpu",
        progress_bar=False,
        seed=0,
        run_name=run_name,
        loggers=list(loggers),
    )
    trainer.fit()
    trainer.close()
    return trainer


def _hide(monkeypatch, module):
    """Make ``import module`` fail as if it were not installed."""
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == module or name.startswith(module + "."):
            raise ModuleNotFoundError(f"No module named {module!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    monkeypatch.setattr("importlib.import_module", lambda name, package=None: fake_import(name))


@pytest.mark.parametrize(
    ("cls", "module", "extra"),
    [
        (WandBLogger, "wandb", "wandb"),
        (TensorBoardLogger, "tensorboard", "tensorboard"),
        (MLflowLogger, "mlflow", "mlflow"),
        (NeptuneLogger, "neptune", "neptune"),
        (CometLogger, "comet_ml", "comet"),
    ],
)
def test_a_missing_client_says_which_extra_installs_it(monkeypatch, cls, module, extra):
    _hide(monkeypatch, module)
    with pytest.raises(ImportError, match=f'pip install "trainkit-loggers\\[{extra}\\]"'):
        cls()


def test_bad_options_are_rejected_by_the_configs():
    with pytest.raises(ValueError, match="wandb mode 'dryrun' is not known; use one of 'online'"):
        WandBLoggerConfig(mode="dryrun")
    with pytest.raises(ValueError, match="give a list of tags"):
        WandBLoggerConfig(tags="baseline")
    assert WandBLoggerConfig(tags=("a", "b")).tags == ["a", "b"]
    with pytest.raises(ValueError, match="experiment_name is empty"):
        MLflowLoggerConfig(experiment_name="")


# --- wandb -------------------------------------------------------------------------------


def _wandb_records(path):
    """Records of a .wandb file (a LevelDB-style log of protobuf records)."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32 * 1024
    assert data[:4] == b":W&B"
    pos, chunks = 7, []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        if pos + 7 + length > len(data):  # still being written
            return
        chunks.append(data[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def _finished_wandb_records(path, timeout=30.0):
    # wandb's service process may still be writing the file when finish() returns.
    deadline = time.monotonic() + timeout
    while True:
        records = list(_wandb_records(path))
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, "the wandb run file was never completed"
        time.sleep(0.1)


def test_wandb_offline_run_holds_config_and_every_step(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    # dir= as well as WANDB_DIR: wandb keeps the settings of the first run in a process.
    logger = WandBLogger(project="trainkit-tests", config={"note": "hello"}, dir=str(tmp_path))
    artifact = tmp_path / "notes.txt"
    artifact.write_text("x")
    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(64)),
        max_duration="5ba",
        device="cpu",
        progress_bar=False,
        run_name="wb",
        loggers=[logger],
    )
    trainer.fit()
    logger.upload_file("notes", artifact)
    logger.log_hyperparameters({"algorithms": [{"name": "EMA", "half_life": "100ba"}]})
    trainer.close()
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    records = _finished_wandb_records(run_file)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == "wb" and run.project == "trainkit-tests"
    config = {
        item.key: json.loads(item.value_json)
        for r in records
        if r.WhichOneof("record_type") == "config"
        for item in r.config.update
    }
    config.update({item.key: json.loads(item.value_json) for item in run.config.update})
    assert config["note"] == "hello" and config["max_duration"] == "5ba"
    # wandb's config takes the nested hyperparameters as they are.
    (logged,) = config["loggers"]
    assert logged["name"] == "WandBLogger" and logged["project"] == "trainkit-tests"
    assert logged["config"] == {"note": "hello"}
    assert config["algorithms"] == [{"name": "EMA", "half_life": "100ba"}]
    history = [
        {
            item.key or "/".join(item.nested_key): json.loads(item.value_json)
            for item in r.history.item
        }
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    losses = [(h["_step"], h["loss/train/total"]) for h in history if "loss/train/total" in h]
    assert [step for step, _ in losses] == [1, 2, 3, 4, 5]
    assert all(isinstance(loss, float) for _, loss in losses)
    assert logger.run is None  # finished on close


# --- TensorBoard -------------------------------------------------------------------------


def test_tensorboard_event_files_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(log_dir=tmp_path / "{run_name}")
    _fit(logger, run_name="tb")
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    losses = events.Scalars("loss/train/total")
    assert [e.step for e in losses] == [1, 2, 3, 4, 5, 6]
    assert [e.step for e in events.Scalars("metrics/eval/accuracy")] == [3, 6]
    assert 0.0 < losses[0].value < 10.0
    (text,) = events.Tensors("hyperparameters/text_summary")
    table = text.tensor_proto.string_val[0]
    assert b"max_duration | 6ba" in table
    # Nested hyperparameters flattened to dotted keys, one row each.
    assert b"| loggers.0.name | TensorBoardLogger |" in table
    assert b"| loggers.0.log_dir | " + str(tmp_path / "{run_name}").encode() + b" |" in table
    assert b"| optimizers.0.name | AdamW |" in table


def test_tensorboard_flattens_nested_hyperparameters(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(log_dir=tmp_path)
    logger.log_hyperparameters(
        {"algorithms": [{"name": "EMA", "half_life": "100ba"}], "betas": (0.9, 0.95), "none": []}
    )
    logger.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    (text,) = events.Tensors("hyperparameters/text_summary")
    rows = text.tensor_proto.string_val[0].decode().splitlines()[2:]
    assert rows == [
        "| algorithms.0.name | EMA |",
        "| algorithms.0.half_life | 100ba |",
        "| betas.0 | 0.9 |",
        "| betas.1 | 0.95 |",
        "| none | [] |",
    ]


# --- MLflow ------------------------------------------------------------------------------


def test_mlflow_file_store_run_reads_back(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    logger = MLflowLogger(tracking_uri=uri, experiment_name="tests", tags={"team": "t"})
    artifact = tmp_path / "weights.bin"
    artifact.write_bytes(b"w")
    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(64)),
        max_duration="4ba",
        device="cpu",
        progress_bar=False,
        run_name="ml",
        loggers=[logger],
    )
    trainer.fit()
    logger.upload_file("checkpoints/final.bin", artifact)
    run_id = logger.run_id
    trainer.close()

    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.run_name == "ml" and run.info.status == "FINISHED"
    assert run.data.params["max_duration"] == "4ba" and run.data.tags["team"] == "t"
    # Nested hyperparameters become flat parameters with dotted keys.
    assert run.data.params["loggers.0.name"] == "MLflowLogger"
    assert run.data.params["loggers.0.experiment_name"] == "tests"
    assert run.data.params["optimizers.0.name"] == "AdamW"
    assert "loggers" not in run.data.params
    history = client.get_metric_history(run_id, "loss/train/total")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]
    assert [a.path for a in client.list_artifacts(run_id, "checkpoints")] == [
        "checkpoints/final.bin"
    ]
    assert client.get_experiment(run.info.experiment_id).name == "tests"


def test_a_remote_store_failing_mid_run_does_not_stop_training(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    logger = MLflowLogger(tracking_uri=(tmp_path / "mlruns").as_uri(), flush_interval=0)
    calls = []

    def unreachable(*args, **kwargs):
        calls.append(1)
        raise ConnectionError("tracking server unreachable")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = Trainer(
            model=mlp(),
            train_dataloader=loader(blobs(64)),
            max_duration="5ba",
            device="cpu",
            progress_bar=False,
            loggers=[logger],
        )
        logger.client.log_batch = unreachable
        trainer.fit()
        trainer.close()
    assert trainer.state.timestamp.batch == 5
    assert len(calls) >= 5  # it kept trying
    reported = [w for w in caught if "tracking server unreachable" in str(w.message)]
    assert len(reported) == 1 and "MLflowLogger.log_metrics failed" in str(reported[0].message)
    assert Path(tmp_path / "mlruns").exists()


def test_mlflow_flattens_nested_hyperparameters(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    logger = MLflowLogger(tracking_uri=uri)
    logger.log_hyperparameters(
        {"algorithms": [{"name": "EMA", "half_life": "100ba"}], "seed": 3, "callbacks": []}
    )
    logger.log_metrics({"x": 1.0}, 1)
    logger.flush()  # starts the run, which writes the hyperparameters logged before
    run_id = logger.run_id
    logger.close()
    assert MlflowClient(uri).get_run(run_id).data.params == {
        "algorithms.0.name": "EMA",
        "algorithms.0.half_life": "100ba",
        "seed": "3",
        "callbacks": "[]",
    }


# --- folders (a checkpoint) as artifacts -------------------------------------------------


def _folder_with_a_link(root):
    """A checkpoint-like folder (nested files) plus a link out of it, which is never given."""
    files = {".metadata": b"meta", "__0_0.distcp": b"shard" * 100, "hf/config.json": b"{}"}
    for relative, data in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(data)
    outside = root.parent / "outside.txt"
    outside.write_text("not part of it")
    (root / "link.txt").symlink_to(outside)
    return files


def test_wandb_upload_folder_logs_one_artifact_holding_every_file(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))  # staged copies
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    checkpoint, other = tmp_path / "ep1-ba4", tmp_path / "plots"
    files = _folder_with_a_link(checkpoint)
    other.mkdir()
    (other / "loss.png").write_bytes(b"png")
    logger = WandBLogger(project="trainkit-tests", dir=str(tmp_path))
    logger.upload_folder("checkpoints/ep1-ba4", checkpoint)
    logger.upload_folder("run/plots", other)
    shutil.rmtree(checkpoint)  # e.g. rotated away at once: wandb holds its own copies
    logger.close()
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    records = _finished_wandb_records(run_file)
    artifacts = {
        r.artifact.name: r.artifact for r in records if r.WhichOneof("record_type") == "artifact"
    }
    assert sorted(artifacts) == ["checkpoints_ep1-ba4", "run_plots"]  # one per folder
    model = artifacts["checkpoints_ep1-ba4"]
    assert model.type == "model" and artifacts["run_plots"].type == "file"
    entries = {entry.path: entry for entry in model.manifest.contents}
    assert sorted(entries) == sorted(files)  # the link is not among them
    for relative, data in files.items():
        assert entries[relative].size == len(data)
        assert Path(entries[relative].local_path).read_bytes() == data
    (png,) = artifacts["run_plots"].manifest.contents
    assert png.path == "loss.png" and Path(png.local_path).read_bytes() == b"png"


def test_mlflow_upload_folder_puts_the_files_under_the_name(tmp_path, monkeypatch):
    from urllib.parse import urlsplit
    from urllib.request import url2pathname

    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    plain, linked = tmp_path / "ep1-ba4", tmp_path / "ep2-ba8"
    files = _folder_with_a_link(linked)
    for relative, data in files.items():
        (plain / relative).parent.mkdir(parents=True, exist_ok=True)
        (plain / relative).write_bytes(data)
    logger = MLflowLogger(tracking_uri=uri)
    logger.upload_folder("checkpoints/ep1-ba4", plain)  # one log_artifacts call
    logger.upload_folder("checkpoints/ep2-ba8", linked)  # file by file, the link left out
    run_id = logger.run_id
    logger.close()

    run = MlflowClient(uri).get_run(run_id)
    root = Path(url2pathname(urlsplit(run.info.artifact_uri).path))
    for name in ("ep1-ba4", "ep2-ba8"):
        stored = root / "checkpoints" / name
        found = {
            p.relative_to(stored).as_posix(): p.read_bytes()
            for p in stored.rglob("*")
            if p.is_file()
        }
        assert found == files, name
