"""`TensorBoardLogger`: scalars, hyperparameters and images as TensorBoard event files."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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
    resolve_folder,
)

__all__ = ["TensorBoardLogger", "TensorBoardLoggerConfig"]


@dataclass(kw_only=True)
class TensorBoardLoggerConfig(BufferedDestinationConfig):
    log_dir: str | Path = "runs/{run_name}/tensorboard"
    """The event files' folder; ``{run_name}`` and ``{rank}`` are filled in when the run
    starts (a `Path` is kept as its text)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.log_dir = path_text(self.log_dir)


class TensorBoardLogger(BufferedDestination, config=TensorBoardLoggerConfig):
    """Writes event files under ``log_dir`` (``tensorboard --logdir runs`` shows them).

    Numeric metrics become scalars at their step; hyperparameters become a text summary
    (a Markdown table) named ``hyperparameters``, nested values flattened to dotted keys
    (``algorithms.0.half_life``); images go through ``add_images``; tables (e.g. the
    `Generate` callback's samples) become text summaries (Markdown tables) at their step. Options:
    `TensorBoardLoggerConfig`.

    Raises:
        ImportError: tensorboard is not installed
            (``pip install "trainkit-loggers[tensorboard]"``).
    """

    config: TensorBoardLoggerConfig

    def __init__(self, config: TensorBoardLoggerConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        import_extra("tensorboard", "tensorboard")  # torch's SummaryWriter needs it
        self.writer: Any = None

    @property
    def log_dir(self) -> Path:
        return resolve_folder(self.config.log_dir, self._state)

    def _start(self, state: State | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(self.log_dir))

    def _write(self, records: list[Record]) -> None:
        for step, when, values in records:
            for key, value in values.items():
                number = numeric(value)
                if number is not None:
                    self.writer.add_scalar(key, number, global_step=step, walltime=when)
        self.writer.flush()

    def _finish(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def _write_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        rows = "\n".join(f"| {k} | {v} |" for k, v in flatten(hyperparameters).items())
        self.writer.add_text("hyperparameters", f"| name | value |\n|---|---|\n{rows}")

    def log_table(
        self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int
    ) -> None:
        if not self._enabled():
            return
        self.flush()
        self._ensure_started()
        self.writer.add_text(name, markdown_table(columns, rows), global_step=step)
        self.writer.flush()

    def log_images(self, name: str, images: torch.Tensor | Sequence[Any], step: int) -> None:
        if not self._enabled():
            return
        self.flush()
        if isinstance(images, torch.Tensor):
            batch = images.detach().cpu()
        else:
            batch = torch.stack([torch.as_tensor(image).detach().cpu() for image in images])
        if batch.ndim == 3:
            batch = batch.unsqueeze(0)
        layout = "NCHW" if batch.shape[1] in (1, 3, 4) else "NHWC"
        self.writer.add_images(name, batch, global_step=step, dataformats=layout)


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """The table in Markdown, as TensorBoard's text panel shows it."""

    def cell(value: Any) -> str:
        return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")

    lines = [
        "| " + " | ".join(cell(c) for c in columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(cell(v) for v in row) + " |" for row in rows),
    ]
    return "\n".join(lines)
