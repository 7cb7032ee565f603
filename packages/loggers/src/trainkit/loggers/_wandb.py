"""`WandBLogger`: metrics, configuration, images and files to Weights & Biases."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from trainkit.core import State
from trainkit.loggers._common import (
    BufferedDestination,
    BufferedDestinationConfig,
    Record,
    import_extra,
    path_text,
)

__all__ = ["WandBLogger", "WandBLoggerConfig"]

_MODES = ("online", "offline", "disabled", "shared")


@dataclass(kw_only=True)
class WandBLoggerConfig(BufferedDestinationConfig):
    project: str | None = None
    """The wandb project (default: wandb's, ``WANDB_PROJECT``)."""
    entity: str | None = None
    """The wandb user or team that owns the project (default: wandb's)."""
    group: str | None = None
    """Groups runs together in the wandb UI (e.g. the ranks or trials of one experiment)."""
    tags: list[str] = field(default_factory=list)
    """Tags of the wandb run."""
    run_name: str | None = None
    """The wandb run's name (default: the trainkit run name). Passed to ``wandb.init`` as
    ``name`` (a config's ``name`` is the component's own, in config files and logs)."""
    config: dict[str, Any] = field(default_factory=dict)
    """Extra configuration, merged with (and winning over) the Trainer's hyperparameters."""
    mode: Literal["online", "offline", "disabled", "shared"] | None = None
    """``"online"``, ``"offline"``, ``"disabled"`` or ``"shared"`` (default: wandb's,
    ``WANDB_MODE``)."""
    dir: str | Path | None = None
    """Where wandb keeps its local files (default: wandb's, ``WANDB_DIR``)."""
    init_kwargs: dict[str, Any] = field(default_factory=dict)
    """Anything else for ``wandb.init`` (wins over the fields above)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.tags, str):
            raise ValueError(
                f"tags {self.tags!r} is not valid; give a list of tags, e.g. ['baseline']"
            )
        self.tags = list(self.tags)
        self.config = dict(self.config or {})
        self.init_kwargs = dict(self.init_kwargs or {})
        if self.mode is not None and self.mode not in _MODES:
            raise ValueError(
                f"wandb mode {self.mode!r} is not known; use one of {', '.join(map(repr, _MODES))} "
                "or None (wandb's default)"
            )
        if self.dir is not None:
            self.dir = path_text(self.dir)


class WandBLogger(BufferedDestination, config=WandBLoggerConfig):
    """Logs to a Weights & Biases run, started when the Trainer starts (named after the run).

    Metrics are buffered and sent every ``flush_interval`` seconds with their own steps,
    so the run's charts match the training steps. Hyperparameters become the run's
    config, nested as logged (components as ``{"name": ..., **fields}``). wandb reads its
    usual environment (``WANDB_MODE=offline``, ``WANDB_DIR``, ``WANDB_API_KEY``); ``mode``
    and ``dir`` override it. Tables (e.g. the `Generate` callback's samples) are logged
    as ``wandb.Table`` at their step. `upload_file` logs a ``"file"`` artifact;
    `upload_folder` one artifact for the whole folder (a checkpoint: a ``"model"``
    artifact, as Composer's ``log_artifacts=True`` logs it). Options: `WandBLoggerConfig`.

    Raises:
        ImportError: wandb is not installed (``pip install "trainkit-loggers[wandb]"``).
    """

    config: WandBLoggerConfig

    def __init__(self, config: WandBLoggerConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._wandb = import_extra("wandb", "wandb")
        config = self.config
        self.init_kwargs: dict[str, Any] = {
            "project": config.project,
            "entity": config.entity,
            "group": config.group,
            "tags": list(config.tags) or None,
            "name": config.run_name,
            "config": dict(config.config),
            "mode": config.mode,
            "dir": config.dir,
            **config.init_kwargs,
        }
        self.run: Any = None

    def _start(self, state: State | None) -> None:
        kwargs = {k: v for k, v in self.init_kwargs.items() if v is not None}
        if "name" not in kwargs and state is not None:
            kwargs["name"] = state.run_name
        # Hyperparameters logged so far go in with the run's config.
        kwargs["config"] = {**self._pending_hyperparameters, **kwargs.get("config", {})}
        self._pending_hyperparameters = {}
        self.run = self._wandb.init(**kwargs)

    def _write(self, records: list[Record]) -> None:
        for step, _, values in records:
            self.run.log(values, step=step)

    def _finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None

    def _write_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        self.run.config.update(hyperparameters, allow_val_change=True)

    def log_images(self, name: str, images: torch.Tensor | Sequence[Any], step: int) -> None:
        if not self._enabled():
            return
        self.flush()  # keep steps in order
        if isinstance(images, torch.Tensor):
            images = images.detach().cpu()
            if images.ndim == 3:
                images = images.unsqueeze(0)
            if images.shape[1] in (1, 3, 4):  # NCHW -> NHWC, as wandb.Image expects
                images = images.permute(0, 2, 3, 1)
            images = list(images.numpy())
        self.run.log({name: [self._wandb.Image(image) for image in images]}, step=step)

    def log_table(
        self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int
    ) -> None:
        if not self._enabled():
            return
        self.flush()  # keep steps in order
        self._ensure_started()
        table = self._wandb.Table(columns=list(columns), data=[list(r) for r in rows])
        self.run.log({name: table}, step=step)

    def upload_file(self, name: str, path: str | Path, overwrite: bool = False) -> None:
        """Log ``path`` as a wandb artifact named after ``name`` (new versions, never replaced)."""
        if not self._enabled():
            return
        self._ensure_started()
        artifact = self._wandb.Artifact(_artifact_name(name), type="file")
        artifact.add_file(str(path))
        self.run.log_artifact(artifact)

    def upload_folder(self, name: str, path: str | Path, overwrite: bool = False) -> None:
        """Log the folder ``path`` as one wandb artifact named after ``name`` (``/`` and
        other characters wandb refuses become ``_``: ``checkpoints_ep1-ba500``), holding
        each of `folder_files` at its path inside the folder.

        Its type is ``"model"`` when ``name`` starts with ``"checkpoints/"`` (what the
        `Checkpointer`'s ``upload_to_loggers`` gives; wandb's model registry takes it),
        else ``"file"``: decided from the name, since the `Logger` passes no type. Each
        upload is a new version (``overwrite`` is not needed). wandb copies the files into
        its staging folder (``WANDB_DATA_DIR``) before returning, so the folder may change
        or be deleted afterwards (e.g. by checkpoint rotation) without harming the upload.
        """
        if not self._enabled():
            return
        self._ensure_started()
        kind = "model" if name.startswith("checkpoints/") else "file"
        artifact = self._wandb.Artifact(_artifact_name(name), type=kind)
        for relative in self.folder_files(path):
            artifact.add_file(str(Path(path, relative)), name=relative)
        self.run.log_artifact(artifact)


def _artifact_name(name: str) -> str:
    # wandb accepts letters, digits, "_", "-" and "." in artifact names.
    return re.sub(r"[^\w.-]", "_", name)
