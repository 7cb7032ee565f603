"""`InMemoryLogger`: everything logged, kept in the process, for tests and notebooks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from trainkit.core import LoggerDestination
from trainkit.loggers._common import to_python

__all__ = ["InMemoryLogger"]


class InMemoryLogger(LoggerDestination):
    """Keeps the full history of every metric; values are converted only when read.

    Example::

        memory = InMemoryLogger()
        Trainer(..., loggers=[memory]).fit()
        memory.latest["loss/train/total"]        # 0.31
        memory.history("loss/train/total")       # [(1, 0.69), (2, 0.64), ...]
        memory.hyperparameters["max_duration"]   # as logged: nested dicts and lists kept
    """

    def __init__(self, config: None = None, /, **options: Any) -> None:
        super().__init__(config, **options)  # nothing to configure: its config is None
        self.hyperparameters: dict[str, Any] = {}
        self.images: list[tuple[str, int, Any]] = []
        self.files: list[tuple[str, Path]] = []
        self.tables: list[tuple[str, int, list[str], list[list[Any]]]] = []
        """Every logged table: ``(name, step, columns, rows)``."""
        self._raw: dict[str, list[tuple[int, Any]]] = {}

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        self.hyperparameters.update(hyperparameters)

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        for key, value in metrics.items():
            if isinstance(value, torch.Tensor):
                value = value.detach()
            self._raw.setdefault(key, []).append((step, value))

    def log_images(self, name: str, images: torch.Tensor | Sequence[Any], step: int) -> None:
        self.images.append((name, step, images))

    def log_table(
        self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int
    ) -> None:
        self.tables.append((name, step, list(columns), [list(row) for row in rows]))

    def upload_file(self, name: str, path: str | Path, overwrite: bool = False) -> None:
        self.files.append((name, Path(path)))

    @property
    def keys(self) -> list[str]:
        """Every metric name logged so far, in first-logged order."""
        return list(self._raw)

    def history(self, key: str) -> list[tuple[int, Any]]:
        """``[(step, value), ...]`` for ``key``, oldest first."""
        if key not in self._raw:
            raise KeyError(f"no metric {key!r} was logged; logged: {sorted(self._raw) or 'none'}")
        records = to_python([(step, 0.0, {key: value}) for step, value in self._raw[key]])
        return [(step, values[key]) for step, _, values in records]

    @property
    def latest(self) -> dict[str, Any]:
        """The last value of every metric."""
        last = {key: entries[-1][1] for key, entries in self._raw.items()}
        ((_, _, values),) = to_python([(0, 0.0, last)])
        return values
