"""`FileLogger`: metrics and hyperparameters as JSON lines, one file per run."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import IO, Any, ClassVar

from trainkit.core import State
from trainkit.loggers._common import (
    BufferedDestination,
    BufferedDestinationConfig,
    Record,
    path_text,
    resolve_folder,
)

__all__ = ["FileLogger", "FileLoggerConfig", "read_jsonl"]

_DEFAULT_FOLDER = "runs/{run_name}"


@dataclass(kw_only=True)
class FileLoggerConfig(BufferedDestinationConfig):
    unknown_field_hints: ClassVar[dict[str, str]] = {
        # Composer's FileLogger (a text log) arguments that a port may still pass.
        "remote_file_name": "not offered: log to a remote destination as well (WandBLogger, "
        "MLflowLogger, ...)",
        "capture_stdout": "not offered: the file holds logged values, not console output",
        "capture_stderr": "not offered: the file holds logged values, not console output",
        "log_level": "not needed: every logged value is written",
        "log_traces": "give the Trainer log_traces=True",
        "buffer_size": "use flush_interval=... (seconds between writes)",
        "overwrite": "not offered: a resumed run appends; give a new folder or filename",
    }

    folder: str | Path = _DEFAULT_FOLDER
    """The run's folder; ``{run_name}`` and ``{rank}`` are filled in when the run starts
    (a `Path` is kept as its text)."""
    filename: str = "metrics.jsonl"
    """The file's name inside ``folder`` (may also contain ``{run_name}`` and ``{rank}``).
    A path with a folder of its own (Composer's ``filename``, e.g. ``"runs/port/log.txt"``)
    is used as it is, relative to the working directory, never put inside ``folder`` a
    second time; ``folder`` must then be left at its default or be where that path lies."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.folder = path_text(self.folder)
        name, folder = PurePath(self.filename), PurePath(self.folder)
        if name.parent == PurePath(".") or self.folder == _DEFAULT_FOLDER:
            return
        if name.parts[: len(folder.parts)] != folder.parts:
            raise ValueError(
                f"FileLogger got folder={self.folder!r} and filename={self.filename!r}, a path "
                f"outside that folder; give the file's folder once: folder={str(name.parent)!r}, "
                f"filename={name.name!r} (or filename={self.filename!r} alone)"
            )


class FileLogger(BufferedDestination, config=FileLoggerConfig):
    """Writes ``{folder}/{filename}``: one JSON object per line, appended, readable while training.

    Lines are ``{"step": 12, "time": <unix s>, "metrics": {"loss/train/total": 0.69, ...}}``,
    once per run ``{"time": ..., "hyperparameters": {...}}``, and for each logged table
    (e.g. the `Generate` callback's samples) ``{"step": 12, "time": ..., "table": {"name":
    "generations", "columns": [...], "rows": [[...], ...]}}``. Logged values are kept
    as they are (tensors stay on their device) and written every ``flush_interval``
    seconds, at the end of `fit`, and on `close`: no device sync and no file write per
    step. A resumed run appends to the same file. Non-finite values are written as
    ``NaN`` / ``Infinity`` (what Python's json module reads back). Logged tensors must not
    be changed in place before they are written. Options: `FileLoggerConfig`.
    """

    config: FileLoggerConfig

    def __init__(self, config: FileLoggerConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self._file: IO[str] | None = None
        self._path: Path | None = None

    @property
    def path(self) -> Path:
        """The JSON-lines file (final once the run has started)."""
        if self._path is not None:
            return self._path
        name = resolve_folder(self.config.filename, self._state)
        if name.parent != Path("."):  # a path of its own (see FileLoggerConfig.filename)
            return name
        return resolve_folder(self.config.folder, self._state) / name

    def _start(self, state: State | None) -> None:
        path = self.path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", encoding="utf-8")
        except OSError as err:
            raise OSError(
                f"FileLogger cannot write {str(path)!r} ({err.strerror or err}); give a folder "
                "that can be created and written, e.g. FileLogger('runs/{run_name}')"
            ) from err
        self._path = path

    def _write(self, records: list[Record]) -> None:
        self._append(
            json.dumps({"step": step, "time": when, "metrics": values}, default=str)
            for step, when, values in records
        )

    def _append(self, lines: Any) -> None:
        assert self._file is not None
        self._file.write("".join(line + "\n" for line in lines))
        self._file.flush()

    def _finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write_hyperparameters(self, hyperparameters: dict[str, Any]) -> None:
        line = {"time": time.time(), "hyperparameters": hyperparameters}
        self._append([json.dumps(line, default=str)])

    def log_table(
        self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int
    ) -> None:
        """Append the table as one line, after the metrics buffered so far."""
        if not self._enabled():
            return
        self.flush()
        self._ensure_started()
        table = {"name": name, "columns": list(columns), "rows": [list(r) for r in rows]}
        line = {"step": step, "time": time.time(), "table": table}
        self._append([json.dumps(line, default=str)])

    def upload_file(self, name: str, path: str | Path, overwrite: bool = False) -> None:
        """Copy ``path`` to ``name`` inside the run's folder (nothing to do when ``path`` is
        already that file: e.g. a checkpoint saved in the run's folder, given as
        ``checkpoints/<name>``)."""
        if not self._enabled():
            return
        target = self.path.parent / name
        if target.exists() and os.path.samefile(target, path):
            return
        if target.exists() and not overwrite:
            raise FileExistsError(f"{str(target)!r} exists; pass overwrite=True to replace it")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a `FileLogger` file, skipping a last line still being written."""
    records = []
    with Path(path).open(encoding="utf-8") as file:
        for line in file:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if line.endswith("\n"):
                    raise
    return records
