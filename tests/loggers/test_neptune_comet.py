"""Neptune and Comet destinations in their offline modes, read back from the files their
clients write (no network, no account)."""

import json
import zipfile

import pytest
import torch

from toy import blobs, loader, mlp
from trainkit.loggers import CometLogger, CometLoggerConfig, NeptuneLogger, NeptuneLoggerConfig
from trainkit.trainer import Trainer

QUIET_NEPTUNE = {
    "capture_hardware_metrics": False,
    "capture_stdout": False,
    "capture_stderr": False,
    "capture_traceback": False,
    "source_files": [],
    "git_ref": False,
}
QUIET_COMET = {
    "auto_output_logging": False,
    "auto_metric_logging": False,
    "auto_param_logging": False,
    "log_code": False,
    "log_graph": False,
    "log_env_details": False,
    "log_git_metadata": False,
    "log_git_patch": False,
    "display_summary_level": 0,
}


def _fit(logger, tmp_path):
    """Train 4 batches (eval at 2 and 4), then log a table, images and a file."""
    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(64)),
        eval_dataloader=loader(blobs(32), shuffle=False),
        eval_interval="2ba",
        max_duration="4ba",
        device="cpu",
        progress_bar=False,
        run_name="tracked",
        loggers=[logger],
    )
    trainer.fit()
    logger.log_table("generations", ["prompt", "generation"], [["hello", "world"]], 4)
    logger.log_images("Images/Train", torch.rand(2, 3, 4, 4), 4)
    notes = tmp_path / "notes.txt"
    notes.write_text("trainkit")
    logger.upload_file("notes.txt", notes)
    trainer.close()


def test_neptune_offline_run_holds_metrics_parameters_tables_and_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # offline runs are kept in ./.neptune
    logger = NeptuneLogger(mode="offline", tags=["test"], init_kwargs=QUIET_NEPTUNE)
    _fit(logger, tmp_path)
    assert logger.run is None  # stopped on close
    (log,) = tmp_path.glob(".neptune/offline/run__*/data-1.log")
    operations = [json.loads(line)["obj"] for line in log.read_text().splitlines()]
    by_path = {}
    for op in operations:
        by_path.setdefault("/".join(op["path"]), []).append(op)

    assert by_path["sys/name"][-1]["value"] == "tracked"
    losses = [v for op in by_path["training/metrics/loss/train/total"] for v in op["values"]]
    assert [v["step"] for v in losses] == [1, 2, 3, 4]
    assert all(isinstance(v["value"], float) for v in losses)
    accuracy = [v for op in by_path["training/metrics/metrics/eval/accuracy"] for v in op["values"]]
    assert [v["step"] for v in accuracy] == [2, 4]
    # Hyperparameters as a nested namespace; what Neptune cannot store (lists) as text.
    assert by_path["training/hyperparameters/max_duration"][-1]["value"] == "4ba"
    assert "NeptuneLogger" in by_path["training/hyperparameters/loggers"][-1]["value"]
    (table,) = by_path["training/generations/step4"]
    assert table["type"] == "UploadFile" and table["ext"] == "html"
    (page,) = tmp_path.glob(".neptune/offline/run__*/upload_path/*.html")
    assert "<td>hello</td>" in page.read_text() and "<td>world</td>" in page.read_text()
    images = [v for op in by_path["training/Images/Train"] for v in op["values"]]
    assert [v["step"] for v in images] == [4, 4]
    (upload,) = by_path["training/files/notes.txt"]
    assert upload["type"] == "UploadFile" and upload["file_path"].endswith("notes.txt")


# comet_ml checks whether an image array is a path before it reads it.
@pytest.mark.filterwarnings("ignore:stat. path should be string:DeprecationWarning")
def test_comet_offline_experiment_holds_metrics_parameters_tables_and_files(tmp_path):
    logger = CometLogger(
        online=False, offline_directory=tmp_path / "comet", tags=["test"], init_kwargs=QUIET_COMET
    )
    _fit(logger, tmp_path)
    assert logger.experiment is None  # ended on close
    (archive,) = (tmp_path / "comet").glob("*.zip")
    with zipfile.ZipFile(archive) as files:
        messages = [json.loads(line) for line in files.read("messages.json").splitlines()]
        assets = {
            m["payload"]["additional_params"]["fileName"]: files.read(m["payload"]["file_path"])
            for m in messages
            if m["type"] == "file_upload" and m["payload"]["upload_type"] == "asset"
        }
    metrics = [m["payload"]["metric"] for m in messages if m["type"] == "metric_msg"]
    losses = [
        (m["step"], m["metricValue"]) for m in metrics if m["metricName"] == "loss/train/total"
    ]
    assert [step for step, _ in losses] == [1, 2, 3, 4]
    accuracy = [m["step"] for m in metrics if m["metricName"] == "metrics/eval/accuracy"]
    assert accuracy == [2, 4]
    # Comet writes list values (here the empty ones) as "params", others as "param".
    parameters = {
        p["paramName"]: p["paramValue"]
        for m in messages
        if m["type"] == "parameter_msg"
        for p in [m["payload"].get("param") or m["payload"]["params"]]
        if p["source"] == "manual"
    }
    # Nested hyperparameters flattened to dotted keys.
    assert parameters["max_duration"] == "4ba"
    assert parameters["loggers.0.name"] == "CometLogger"
    others = {
        m["payload"]["key"]: m["payload"]["value"] for m in messages if m["type"] == "log_other"
    }
    assert others["Name"] == "tracked"
    assert assets["generations-step4.csv"].decode().splitlines() == [
        "prompt,generation",
        "hello,world",
    ]
    assert assets["notes.txt"] == b"trainkit"
    images = [
        m
        for m in messages
        if m["type"] == "file_upload" and m["payload"]["upload_type"] == "visualization"
    ]
    assert len(images) == 2


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="neptune mode 'dry' is not known; use one of 'async'"):
        NeptuneLoggerConfig(mode="dry")
    with pytest.raises(ValueError, match="base_namespace is empty"):
        NeptuneLoggerConfig(base_namespace="")
    with pytest.raises(ValueError, match="give a list of tags"):
        CometLoggerConfig(tags="baseline")
