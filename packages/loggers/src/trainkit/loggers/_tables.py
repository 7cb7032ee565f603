"""Tables (rows of text and numbers, e.g. generated samples) sent to the destinations that
can show them.

Core's `LoggerDestination` has no table method yet, so the destinations of this package
declare one here, `TableDestination`, and `log_table` sends a table to every destination
of a `Logger` that has it (the others are skipped).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from trainkit.core import Logger

__all__ = ["TableDestination", "check_table", "log_table", "markdown_table"]


@runtime_checkable
class TableDestination(Protocol):
    """A destination that records tables: ``log_table(name, columns, rows, step)``."""

    def log_table(
        self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int
    ) -> None:
        """Record a table: ``rows`` of values under ``columns``, logged at ``step``."""


def check_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Raise ValueError unless every row has one value per column."""
    for index, row in enumerate(rows):
        if len(row) != len(columns):
            raise ValueError(
                f"table row {index} has {len(row)} values but there are {len(columns)} "
                f"columns {list(columns)}; give one value per column"
            )


def log_table(
    logger: Logger,
    name: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    step: int | None = None,
) -> int:
    """Send a table to every destination of ``logger`` that records tables; returns how many.

    As core's `Logger` does for metrics, a destination that raises does not stop training:
    its first error is reported as a warning. ``step`` defaults to the run's batch count.
    """
    check_table(columns, rows)
    if step is None:
        step = logger.state.timestamp.batch if logger.state is not None else 0
    columns, rows = list(columns), [list(row) for row in rows]
    sent = 0
    for destination in logger.destinations:
        if isinstance(destination, TableDestination):
            sent += 1
            try:
                destination.log_table(name, columns, rows, step)
            except Exception as err:
                logger.report_failure(destination, "log_table", err)
    return sent


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """The table in Markdown (as TensorBoard's text panel shows it)."""

    def cell(value: Any) -> str:
        return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")

    lines = [
        "| " + " | ".join(cell(c) for c in columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(cell(v) for v in row) + " |" for row in rows),
    ]
    return "\n".join(lines)
