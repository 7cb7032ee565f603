"""`NeptuneLogger`: metrics, parameters, images, tables and files to a neptune.ai run."""

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
    numeric,
)

__all__ = ["NeptuneLogger", "NeptuneLoggerConfig"]

_MODES = ("async", "sync", "offline", "read-only", "debug")


@dataclass(kw_only=True)
class NeptuneLoggerConfig(BufferedDestinationConfig):
    project: str | None = None
    """``"workspace/project"`` (default: Neptune's, ``NEPTUNE_PROJECT``; not needed
    offline). The API token is read from ``NEPTUNE_API_TOKEN`` only, so that it is never
    logged with the configuration."""
    mode: Literal["async", "sync", "offline", "read-only", "debug"] | None = None
    """Neptune's connection mode: ``"offline"`` keeps everything in ``.neptune/`` (sent
    later with ``neptune sync``), ``"debug"`` keeps nothing (default: Neptune's,
    ``NEPTUNE_MODE``, else ``"async"``)."""
    run_name: str | None = None
    """The Neptune run's name (default: the trainkit run name)."""
    tags: list[str] = field(default_factory=list)
    """Tags of the Neptune run."""
    base_namespace: str = "training"
    """Where in the run everything is logged: ``<base>/metrics/<key>``,
    ``<base>/hyperparameters``, ``<base>/<image or table name>``, ``<base>/files/<name>``
    (Composer's layout)."""
    init_kwargs: dict[str, Any] = field(default_factory=dict)
    """Anything else for ``neptune.init_run`` (``capture_hardware_metrics``, ...)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode is not None and self.mode not in _MODES:
            raise ValueError(
                f"neptune mode {self.mode!r} is not known; use one of "
                f"{', '.join(map(repr, _MODES))} or None (Neptune's default)"
            )
        if not self.base_namespace:
            raise ValueError("base_namespace is empty; name it, e.g. 'training'")
        if isinstance(self.tags, str):
            raise ValueError(f"tags {self.tags!r} is not valid; give a list of tags")
        self.tags = list(self.tags)
        self.init_kwargs = dict(self.init_kwargs or {})


class NeptuneLogger(BufferedDestination, config=NeptuneLoggerConfig):
    """Logs to a neptune.ai run, started when the Trainer starts (named after the run).

    Metrics are buffered and appended every ``flush_interval`` seconds as float series
    ``<base>/metrics/<key>`` at their steps (a step not after the series' last one, as
    after a resume into the same run, is skipped: Neptune refuses it). Hyperparameters are
    assigned as a nested namespace (values Neptune cannot store, lists included, as text);
    images are appended as an image series; a table (e.g. the `Generate` callback's
    samples) is an HTML file ``<base>/<name>/step<step>``; `upload_file` uploads to
    ``<base>/files/<name>``. Offline (``mode="offline"``) it needs neither a network nor
    a project. Options: `NeptuneLoggerConfig`.

    Raises:
        ImportError: neptune is not installed (``pip install "trainkit-loggers[neptune]"``).
    """

    config: NeptuneLoggerConfig

    def __init__(self, config: NeptuneLoggerConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._neptune = import_extra("neptune", "neptune")
        self.run: Any = None
        self._last_step: dict[str, int] = {}

    def _path(self, *parts: str) -> str:
        return "/".join([self.config.base_namespace, *parts])

    def _start(self, state: State | None) -> None:
        config = self.config
        kwargs: dict[str, Any] = {
            "project": config.project,
            "mode": config.mode,
            "name": config.run_name or (state.run_name if state is not None else None),
            "tags": list(config.tags) or None,
            **config.init_kwargs,
        }
        self.run = self._neptune.init_run(**{k: v for k, v in kwargs.items() if v is not None})

    def _write(self, records: list[Record]) -> None:
        for step, when, values in records:
            for key, value in values.items():
                number = numeric(value)
                if number is None or step <= self._last_step.get(key, -1):
                    continue
                self._last_step[key] = step
                self.run[self._path("metrics", key)].append(number, step=step, timestamp=when)

    def _finish(self) -> None:
        if self.run is not None:
            self.run.stop()
            self.run = None

    def _write_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        from neptune.utils import stringify_unsupported

        self.run[self._path("hyperparameters")] = stringify_unsupported(hyperparameters)

    def log_images(self, name: str, images: torch.Tensor | Sequence[Any], step: int) -> None:
        if not self._enabled():
            return
        from neptune.types import File

        self.flush()
        self._ensure_started()
        series = self.run[self._path(name)]
        for image in _hwc_images(images):
            series.append(File.as_image(image), step=step)

    def log_table(
        self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int
    ) -> None:
        if not self._enabled():
            return
        import pandas
        from neptune.types import File

        self.flush()
        self._ensure_started()
        frame = pandas.DataFrame([list(r) for r in rows], columns=list(columns))
        self.run[self._path(name, f"step{step}")].upload(File.as_html(frame))

    def upload_file(self, name: str, path: str | Path, overwrite: bool = False) -> None:
        """Upload ``path`` as ``<base>/files/<name>`` (a later upload replaces it)."""
        if not self._enabled():
            return
        self._ensure_started()
        self.run[self._path("files", re.sub(r"[^\w./-]", "_", name))].upload(str(path))


def _hwc_images(images: torch.Tensor | Sequence[Any]) -> list[Any]:
    """Images as (H, W, C) float arrays in [0, 1], as Neptune's ``File.as_image`` takes them."""
    batch = (
        images
        if isinstance(images, torch.Tensor)
        else torch.stack([torch.as_tensor(image) for image in images])
    )
    batch = batch.detach().cpu().float()
    if batch.ndim == 3:
        batch = batch.unsqueeze(0)
    if batch.shape[1] in (1, 3, 4):  # NCHW (the layout rule of the TensorBoard logger)
        batch = batch.permute(0, 2, 3, 1)
    return list(batch.clamp(0, 1).numpy())
