"""`WandBLogger`: metrics, configuration, images and files to Weights & Biases."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from trainkit.core import State
from trainkit.loggers._common import BufferedDestination, Record, import_extra

__all__ = ["WandBLogger"]


class WandBLogger(BufferedDestination):
    """Logs to a Weights & Biases run, started when the Trainer starts (named after the run).

    Metrics are buffered and sent every ``flush_interval`` seconds with their own steps,
    so the run's charts match the training steps. wandb reads its usual environment
    (``WANDB_MODE=offline``, ``WANDB_DIR``, ``WANDB_API_KEY``); ``mode`` and ``dir``
    override it.

    Args:
        project / entity / group / tags / name: the wandb run's place and name
            (``name`` defaults to the trainkit run name).
        config: extra configuration, merged with the Trainer's hyperparameters.
        mode: ``"online"``, ``"offline"`` or ``"disabled"`` (default: wandb's).
        dir: where wandb keeps its local files.
        flush_interval: seconds between sends.
        rank_zero_only: only rank 0 creates a run.
        init_kwargs: anything else for ``wandb.init``.

    Raises:
        ImportError: wandb is not installed (``pip install "trainkit-loggers[wandb]"``).
    """

    def __init__(
        self,
        project: str | None = None,
        *,
        entity: str | None = None,
        group: str | None = None,
        tags: Sequence[str] = (),
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
        mode: str | None = None,
        dir: str | Path | None = None,
        flush_interval: float = 5.0,
        rank_zero_only: bool = True,
        init_kwargs: Mapping[str, Any] | None = None,
    ):
        super().__init__(flush_interval=flush_interval, rank_zero_only=rank_zero_only)
        self._wandb = import_extra("wandb", "wandb")
        self.init_kwargs: dict[str, Any] = {
            "project": project,
            "entity": entity,
            "group": group,
            "tags": list(tags) or None,
            "name": name,
            "config": dict(config or {}),
            "mode": mode,
            "dir": str(dir) if dir is not None else None,
            **dict(init_kwargs or {}),
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

    def upload_file(self, name: str, path: str | Path, overwrite: bool = False) -> None:
        """Log ``path`` as a wandb artifact named after ``name`` (new versions, never replaced)."""
        if not self._enabled():
            return
        self._ensure_started()
        artifact = self._wandb.Artifact(re.sub(r"[^\w.-]", "_", name), type="file")
        artifact.add_file(str(path))
        self.run.log_artifact(artifact)
