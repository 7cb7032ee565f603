"""`MLflowLogger`: metrics, parameters and files to an MLflow tracking store."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from trainkit.core import State
from trainkit.loggers._common import (
    BufferedDestination,
    BufferedDestinationConfig,
    Record,
    flatten,
    import_extra,
    numeric,
)

__all__ = ["MLflowLogger", "MLflowLoggerConfig"]

_MAX_METRICS_PER_CALL = 1000  # MLflow's limits for one log_batch call
_MAX_PARAMS_PER_CALL = 100
_MAX_PARAM_LENGTH = 6000


def _key(name: str) -> str:
    # MLflow accepts letters, digits, _ - . / : and spaces in metric and parameter names.
    return re.sub(r"[^\w./\- :]", "_", name).lstrip("/")


@dataclass(kw_only=True)
class MLflowLoggerConfig(BufferedDestinationConfig):
    tracking_uri: str | None = None
    """Where runs are stored: a server URL, ``"databricks"``, or a local
    ``"file:/path/mlruns"`` (MLflow 3 requires ``MLFLOW_ALLOW_FILE_STORE=true`` for file
    stores). Default: MLflow's (``MLFLOW_TRACKING_URI``)."""
    experiment_name: str = "trainkit"
    """The experiment, created when missing."""
    run_name: str | None = None
    """The MLflow run's name (default: the trainkit run name)."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags set on the run."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.experiment_name:
            raise ValueError(
                "experiment_name is empty; name the MLflow experiment, e.g. 'trainkit'"
            )
        self.tags = dict(self.tags or {})


class MLflowLogger(BufferedDestination, config=MLflowLoggerConfig):
    """Logs to an MLflow run created when the Trainer starts (named after the run).

    Uses an explicit ``MlflowClient`` (no global MLflow state is touched). Metrics are
    buffered and sent with ``log_batch`` every ``flush_interval`` seconds; hyperparameters
    become run parameters, nested values flattened to dotted keys
    (``algorithms.0.half_life``; values longer than MLflow's limit are cut); `upload_file`
    logs an artifact, `upload_folder` a folder of them (a checkpoint under
    ``checkpoints/<name>/``); a table (e.g. the `Generate` callback's samples) is the JSON artifact
    ``tables/<name>/step<step>.json`` (``{"columns": [...], "rows": [[...], ...]}``); the
    run is marked finished on `close`. Options: `MLflowLoggerConfig`.

    Raises:
        ImportError: MLflow is not installed (``pip install "trainkit-loggers[mlflow]"``).
    """

    config: MLflowLoggerConfig

    def __init__(self, config: MLflowLoggerConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        tracking = import_extra("mlflow.tracking", "mlflow")
        self._entities = import_extra("mlflow.entities", "mlflow")
        self.client = tracking.MlflowClient(tracking_uri=self.config.tracking_uri)
        self.run_id: str | None = None

    def _start(self, state: State | None) -> None:
        config = self.config
        experiment = self.client.get_experiment_by_name(config.experiment_name)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(config.experiment_name)
        )
        name = config.run_name or (state.run_name if state is not None else None)
        run = self.client.create_run(experiment_id, run_name=name, tags=dict(config.tags))
        self.run_id = run.info.run_id

    def _write(self, records: list[Record]) -> None:
        metric = self._entities.Metric
        metrics = [
            metric(_key(key), number, int(when * 1000), step)
            for step, when, values in records
            for key, value in values.items()
            if (number := numeric(value)) is not None
        ]
        for start in range(0, len(metrics), _MAX_METRICS_PER_CALL):
            chunk = metrics[start : start + _MAX_METRICS_PER_CALL]
            self.client.log_batch(self.run_id, metrics=chunk, synchronous=True)

    def _finish(self) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status="FINISHED")
            self.run_id = None

    def _write_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        param = self._entities.Param
        params = [
            param(_key(k), str(v)[:_MAX_PARAM_LENGTH]) for k, v in flatten(hyperparameters).items()
        ]
        for start in range(0, len(params), _MAX_PARAMS_PER_CALL):
            chunk = params[start : start + _MAX_PARAMS_PER_CALL]
            self.client.log_batch(self.run_id, params=chunk, synchronous=True)

    def log_table(
        self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int
    ) -> None:
        if not self._enabled():
            return
        self.flush()
        self._ensure_started()
        table = {"columns": list(columns), "rows": [list(r) for r in rows]}
        self.client.log_dict(self.run_id, table, f"tables/{_key(name)}/step{step}.json")

    def upload_file(self, name: str, path: str | Path, overwrite: bool = False) -> None:
        """Log ``path`` as the run artifact ``name`` (e.g. ``"checkpoints/ep1.pt"``)."""
        if not self._enabled():
            return
        self._ensure_started()
        target = PurePosixPath(name)
        folder = str(target.parent) if str(target.parent) != "." else None
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / target.name
            shutil.copy2(path, local)
            self.client.log_artifact(self.run_id, str(local), artifact_path=folder)

    def upload_folder(self, name: str, path: str | Path, overwrite: bool = False) -> None:
        """Log the folder ``path`` as the run's artifact folder ``name`` (a checkpoint as
        ``checkpoints/ep1-ba500/...``), in one ``log_artifacts`` call. A folder holding
        links is given file by file instead (MLflow would follow them), so every store gets
        the same `folder_files`."""
        if not self._enabled():
            return
        folder = Path(path)
        if any(entry.is_symlink() for entry in folder.rglob("*")):
            super().upload_folder(name, path, overwrite)
            return
        self._ensure_started()
        self.client.log_artifacts(self.run_id, str(folder), artifact_path=name.strip("/") or None)
