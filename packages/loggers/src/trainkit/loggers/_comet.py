"""`CometLogger`: metrics, parameters, images, tables and files to a Comet experiment."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainkit.core import State
from trainkit.loggers._common import (
    BufferedDestination,
    BufferedDestinationConfig,
    Record,
    flatten,
    import_extra,
    numeric,
    path_text,
)

__all__ = ["CometLogger", "CometLoggerConfig"]


@dataclass(kw_only=True)
class CometLoggerConfig(BufferedDestinationConfig):
    project: str | None = None
    """The Comet project (default: Comet's, ``COMET_PROJECT_NAME``). The API key is read
    from Comet's own configuration (``COMET_API_KEY``) only, so that it is never logged
    with the configuration."""
    workspace: str | None = None
    """The Comet workspace (default: Comet's, ``COMET_WORKSPACE``)."""
    online: bool | None = None
    """False: an offline experiment, written as a zip file into ``offline_directory`` (sent
    later with ``comet upload``); no network and no API key needed. None: Comet's own
    setting (``COMET_OFFLINE=true`` for offline; online by default)."""
    offline_directory: str | Path | None = None
    """Where an offline experiment is written (default: Comet's, ``.cometml-runs``; a
    `Path` is kept as its text)."""
    run_name: str | None = None
    """The experiment's name (default: the trainkit run name)."""
    tags: list[str] = field(default_factory=list)
    """Tags of the experiment."""
    init_kwargs: dict[str, Any] = field(default_factory=dict)
    """Anything else for ``comet_ml.Experiment`` / ``OfflineExperiment``
    (``auto_output_logging``, ``log_env_details``, ...)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.tags, str):
            raise ValueError(f"tags {self.tags!r} is not valid; give a list of tags")
        self.tags = list(self.tags)
        if self.offline_directory is not None:
            self.offline_directory = path_text(self.offline_directory)
        self.init_kwargs = dict(self.init_kwargs or {})


class CometLogger(BufferedDestination, config=CometLoggerConfig):
    """Logs to a Comet experiment, started when the Trainer starts (named after the run).

    Metrics are buffered and sent every ``flush_interval`` seconds with ``log_metrics`` at
    their steps; hyperparameters become parameters, nested values flattened to dotted keys
    (``algorithms.0.half_life``); images go through ``log_image``; a table (e.g. the
    `Generate` callback's samples) is the CSV asset ``<name>-step<step>.csv``;
    `upload_file` logs an asset named ``name``. With ``online=False`` everything is
    written to a zip file in ``offline_directory`` when the experiment ends (on `close`),
    and comet_ml's own error reporting to Comet is turned off before comet_ml is first
    imported (``COMET_ERROR_TRACKING_ENABLE=false`` unless already set; online, set it
    yourself to keep it off). Options: `CometLoggerConfig`.

    Raises:
        ImportError: comet_ml is not installed (``pip install "trainkit-loggers[comet]"``).
    """

    config: CometLoggerConfig

    def __init__(self, config: CometLoggerConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        if self.config.online is False:
            # comet_ml sends its own error reports to Comet from `import comet_ml` unless
            # this is off: offline means no network (a value the user set is kept).
            os.environ.setdefault("COMET_ERROR_TRACKING_ENABLE", "false")
        self._comet = import_extra("comet_ml", "comet")
        self.experiment: Any = None

    def _start(self, state: State | None) -> None:
        config = self.config
        kwargs: dict[str, Any] = {
            "project_name": config.project,
            "workspace": config.workspace,
            **config.init_kwargs,
        }
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        online = config.online
        if online is None:  # Comet's configuration decides (COMET_OFFLINE, .comet.config)
            online = not self._comet.get_config().get_bool(None, "comet.offline")
        if online:
            experiment = self._comet.Experiment(**kwargs)
        else:
            if config.offline_directory is not None:
                os.makedirs(config.offline_directory, exist_ok=True)
                kwargs.setdefault("offline_directory", str(config.offline_directory))
            experiment = self._comet.OfflineExperiment(**kwargs)
        name = config.run_name or (state.run_name if state is not None else None)
        if name is not None:
            experiment.set_name(name)
        if config.tags:
            experiment.add_tags(list(config.tags))
        self.experiment = experiment

    def _write(self, records: list[Record]) -> None:
        for step, _, values in records:
            numbers = {k: n for k, v in values.items() if (n := numeric(v)) is not None}
            if numbers:
                self.experiment.log_metrics(numbers, step=step)

    def _finish(self) -> None:
        if self.experiment is not None:
            self.experiment.end()
            self.experiment = None

    def _write_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        self.experiment.log_parameters(flatten(hyperparameters))

    def log_images(self, name: str, images: torch.Tensor | Sequence[Any], step: int) -> None:
        if not self._enabled():
            return
        self.flush()
        self._ensure_started()
        batch = (
            images
            if isinstance(images, torch.Tensor)
            else torch.stack([torch.as_tensor(image) for image in images])
        )
        batch = batch.detach().cpu().float()
        if batch.ndim == 3:
            batch = batch.unsqueeze(0)
        channels = "first" if batch.shape[1] in (1, 3, 4) else "last"
        for index, image in enumerate(batch.clamp(0, 1).numpy()):
            self.experiment.log_image(
                image, name=f"{name}/{index}", step=step, image_channels=channels
            )

    def log_table(
        self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int
    ) -> None:
        if not self._enabled():
            return
        self.flush()
        self._ensure_started()
        self.experiment.log_table(
            f"{name}-step{step}.csv", tabular_data=[list(r) for r in rows], headers=list(columns)
        )

    def upload_file(self, name: str, path: str | Path, overwrite: bool = False) -> None:
        """Log ``path`` as the experiment's asset ``name``."""
        if not self._enabled():
            return
        self._ensure_started()
        self.experiment.log_asset(str(path), file_name=name, overwrite=overwrite)
