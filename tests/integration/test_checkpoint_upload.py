"""Checkpoints and the run's files given to a real logger destination (MLflow, local file
store): from the Trainer's ``save_upload_to_loggers``, and from ``trainkit train``."""

from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

import pytest
import torch

from toy import blobs, loader, mlp
from trainkit.checkpoint import list_checkpoints
from trainkit.cli import main
from trainkit.loggers import MLflowLogger
from trainkit.trainer import Trainer


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _artifacts(uri: str, run_id: str) -> Path:
    from mlflow.tracking import MlflowClient

    artifact_uri = MlflowClient(uri).get_run(run_id).info.artifact_uri
    return Path(url2pathname(urlsplit(artifact_uri).path))


def _trainer(tmp_path, **kwargs):
    model = mlp(dropout=0.0)
    return Trainer(
        model=model,
        train_dataloader=loader(blobs(64)),  # 4 batches an epoch
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        max_duration="3ba",
        progress_bar=False,
        device="cpu",
        seed=3,
        run_name="upload",
        **kwargs,
    )


def test_trainer_save_upload_to_loggers_gives_mlflow_every_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    mlflow = MLflowLogger(tracking_uri=uri, experiment_name="uploads")
    trainer = _trainer(
        tmp_path,
        save_folder=str(tmp_path / "{run_name}"),
        save_interval="2ba",
        save_upload_to_loggers=True,
        loggers=[mlflow],
    )
    trainer.fit()
    run_id = mlflow.run_id
    trainer.close()
    saved = sorted(list_checkpoints(tmp_path / "upload"))
    assert [p.name for p in saved] == ["ep0-ba2", "ep0-ba3"]
    stored = _artifacts(uri, run_id) / "checkpoints"
    assert sorted(p.name for p in stored.iterdir()) == ["ep0-ba2", "ep0-ba3"]
    for folder in saved:  # the same files, byte for byte (shards, .metadata, manifest)
        assert _files(stored / folder.name) == _files(folder)
        assert "trainkit-manifest.json" in _files(stored / folder.name)


def test_trainer_refuses_an_upload_it_cannot_do(tmp_path):
    with pytest.raises(ValueError, match="save_upload_to_loggers=True needs save_folder"):
        _trainer(tmp_path, save_upload_to_loggers=True)
    with pytest.raises(ValueError, match="folder 's3://bucket/runs' is a URL"):
        _trainer(tmp_path, save_folder="s3://bucket/runs", save_upload_to_loggers=True)


TINY = """\
model: {name: "trainkit.cli._default:tiny_gpt2", n_layer: 1, n_head: 2, n_embd: 32, n_positions: 32}
data: {name: stdlib_text, seq_len: 32, batch_size: 8, max_bytes: 60000, eval_bytes: 4096}
optimizers: {name: AdamW, lr: 0.003}
loggers: [{name: mlflow, tracking_uri: "%s", experiment_name: cli}]
checkpoint: {interval: 2ba, upload_to_loggers: true}
trainer: {max_duration: 2ba, eval_interval: 2ba, device: cpu, progress_bar: false}
"""


def test_cli_run_gives_its_files_and_checkpoints_to_the_loggers(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY % uri)
    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run_dir)]) == 0
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("cli").experiment_id])
    stored = _artifacts(uri, run.info.run_id)
    # Named as in the run folder (no sample.txt: a model from a factory is not sampled).
    own = ["config.yaml", *sorted(p.name for p in run_dir.glob("*.png"))]
    assert "loss.png" in own
    assert sorted(p.name for p in stored.iterdir() if p.is_file()) == sorted(own)
    for name in own:
        assert (stored / name).read_bytes() == (run_dir / name).read_bytes()
    checkpoint = run_dir / "checkpoints" / "ep0-ba2"
    assert _files(stored / "checkpoints" / "ep0-ba2") == _files(checkpoint)
    # The file logger writes in the run folder, where these already are: nothing copied.
    assert sorted(p.name for p in run_dir.iterdir() if p.is_dir()) == ["checkpoints"]
