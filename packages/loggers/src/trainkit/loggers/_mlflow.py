"""`MLflowLogger`: metrics, parameters and files to an MLflow tracking store."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from trainkit.core import State
from trainkit.loggers._common import BufferedDestination, Record, import_extra, numeric

__all__ = ["MLflowLogger"]

_MAX_METRICS_PER_CALL = 1000  # MLflow's limits for one log_batch call
_MAX_PARAMS_PER_CALL = 100
_MAX_PARAM_LENGTH = 6000


def _key(name: str) -> str:
    # MLflow accepts letters, digits, _ - . / : and spaces in metric and parameter names.
    return re.sub(r"[^\w./\- :]", "_", name).lstrip("/")


class MLflowLogger(BufferedDestination):
    """Logs to an MLflow run created when the Trainer starts (named after the run).

    Uses an explicit ``MlflowClient`` (no global MLflow state is touched). Metrics are
    buffered and sent with ``log_batch`` every ``flush_interval`` seconds; hyperparameters
    become run parameters (values longer than MLflow's limit are cut); `upload_file`
    logs an artifact; the run is marked finished on `close`.

    Args:
        tracking_uri: where runs are stored: a server URL, ``"databricks"``, or a local
            ``"file:/path/mlruns"`` (MLflow 3 requires ``MLFLOW_ALLOW_FILE_STORE=true`` for
            file stores). Default: MLflow's (``MLFLOW_TRACKING_URI``).
        experiment_name: the experiment, created when missing.
        run_name: the MLflow run's name (default: the trainkit run name).
        tags: tags set on the run.
        flush_interval: seconds between sends.
        rank_zero_only: only rank 0 creates a run.

    Raises:
        ImportError: MLflow is not installed (``pip install "trainkit-loggers[mlflow]"``).
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        *,
        experiment_name: str = "trainkit",
        run_name: str | None = None,
        tags: Mapping[str, str] | None = None,
        flush_interval: float = 5.0,
        rank_zero_only: bool = True,
    ):
        super().__init__(flush_interval=flush_interval, rank_zero_only=rank_zero_only)
        tracking = import_extra("mlflow.tracking", "mlflow")
        self._entities = import_extra("mlflow.entities", "mlflow")
        self.client = tracking.MlflowClient(tracking_uri=tracking_uri)
        self.experiment_name = experiment_name
        self.run_name = run_name
        self.tags = dict(tags or {})
        self.run_id: str | None = None

    def _start(self, state: State | None) -> None:
        experiment = self.client.get_experiment_by_name(self.experiment_name)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(self.experiment_name)
        )
        name = self.run_name or (state.run_name if state is not None else None)
        run = self.client.create_run(experiment_id, run_name=name, tags=self.tags)
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
        params = [param(_key(k), str(v)[:_MAX_PARAM_LENGTH]) for k, v in hyperparameters.items()]
        for start in range(0, len(params), _MAX_PARAMS_PER_CALL):
            chunk = params[start : start + _MAX_PARAMS_PER_CALL]
            self.client.log_batch(self.run_id, params=chunk, synchronous=True)

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
