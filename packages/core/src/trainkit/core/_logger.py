"""`Logger`: sends everything logged to every `LoggerDestination`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainkit.core._callback import call_close
from trainkit.core._checks import check_destination
from trainkit.core._destination import LoggerDestination
from trainkit.core.messages import warn

if TYPE_CHECKING:
    from trainkit.core._state import State

__all__ = ["Logger"]


class Logger:
    """Sends everything logged to every destination.

    A destination that raises does not stop training: the error is reported once as a
    warning and that destination keeps being called (a full disk may clear up).
    """

    def __init__(self, destinations: Iterable[LoggerDestination] = (), state: State | None = None):
        self.destinations: list[LoggerDestination] = list(destinations)
        for destination in self.destinations:
            check_destination(destination)
        self.state = state
        self._warned: set[int] = set()

    def _fan_out(self, method: str, *args: Any) -> None:
        for dest in self.destinations:
            try:
                getattr(dest, method)(*args)
            except Exception as err:
                self.report_failure(dest, method, err)

    def report_failure(self, destination: object, method: str, err: Exception) -> None:
        """Warn once per destination that it failed; training goes on."""
        if id(destination) not in self._warned:
            self._warned.add(id(destination))
            warn(
                f"logger destination {type(destination).__name__}.{method} failed ({err!r}); "
                "training continues, further errors from it are not reported",
                RuntimeWarning,
            )

    def _step(self, step: int | None) -> int:
        if step is not None:
            return step
        return self.state.timestamp.batch if self.state is not None else 0

    def log_hyperparameters(self, hyperparameters: Mapping[str, Any]) -> None:
        self._fan_out("log_hyperparameters", dict(hyperparameters))

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        if self.destinations:
            self._fan_out("log_metrics", metrics, self._step(step))

    def log_images(self, name: str, images: Any, step: int | None = None) -> None:
        self._fan_out("log_images", name, images, self._step(step))

    def log_table(
        self,
        name: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        step: int | None = None,
    ) -> None:
        """Send a table to every destination (those that do not record tables ignore it).

        Raises ValueError unless every row has one value per column; each destination gets
        its own lists (``columns`` and rows copied), so one cannot change another's.
        """
        for index, row in enumerate(rows):
            if len(row) != len(columns):
                raise ValueError(
                    f"table {name!r}: row {index} has {len(row)} values but there are "
                    f"{len(columns)} columns {list(columns)}; give one value per column"
                )
        step = self._step(step)
        for dest in self.destinations:
            try:
                dest.log_table(name, list(columns), [list(row) for row in rows], step)
            except Exception as err:
                self.report_failure(dest, "log_table", err)

    def upload_file(self, name: str, path: str | Path, overwrite: bool = False) -> None:
        self._fan_out("upload_file", name, path, overwrite)

    def upload_folder(self, name: str, path: str | Path, overwrite: bool = False) -> None:
        """Give the folder ``path`` to every destination as the artifact ``name``.

        Raises NotADirectoryError unless ``path`` is a folder (a destination's own failure
        is reported as a warning, as for the other calls).
        """
        if not Path(path).is_dir():
            raise NotADirectoryError(
                f"upload_folder({name!r}, {str(path)!r}): {str(path)!r} is not a folder; "
                "give a local folder, or use upload_file for one file"
            )
        self._fan_out("upload_folder", name, path, overwrite)

    def log_traces(self, traces: Mapping[str, Any], step: int | None = None) -> None:
        self._fan_out("log_traces", traces, self._step(step))

    def close(self) -> None:
        """Close every destination (`Engine.close` does this at the end of a run)."""
        for dest in self.destinations:
            try:
                call_close(dest, self.state, self)
            except Exception as err:
                self.report_failure(dest, "close", err)
