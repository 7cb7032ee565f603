"""Writing the CUDA allocator's snapshot: the pickle and its HTML views, shared by
`MemorySnapshot` and `OOMObserver`."""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainkit.core import Logger, State

__all__ = ["check_positive", "cuda_run", "resolve_folder", "write_snapshot"]

log = logging.getLogger("trainkit.profiler")

Snapshot = dict[str, Any]


def check_positive(owner: str, name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner} {name}={value!r} is not valid; use an int >= {minimum}")


def cuda_run(owner: str, state: State) -> bool:
    """Whether the run is on CUDA; if not, say once (at info level) that ``owner`` does nothing."""
    if state.device.type == "cuda":
        return True
    log.info(
        "%s does nothing in this run: it records the CUDA allocator, and the run is on %s",
        owner,
        state.device.type,
    )
    return False


def resolve_folder(owner: str, template: str, state: State) -> Path:
    """``template`` with ``{run_name}`` and ``{rank}`` filled in, created."""
    try:
        folder = Path(template.format(run_name=state.run_name, rank=state.rank))
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(
            f"{owner} folder {template!r} is not a valid template ({err!r}); it may contain "
            "'{run_name}' and '{rank}', e.g. 'runs/{run_name}/memory'"
        ) from err
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OSError(
            f"{owner} cannot create its folder {str(folder)!r} ({err.strerror or err}); give "
            "a folder that can be written, e.g. 'runs/{run_name}/memory'"
        ) from err
    return folder


def write_snapshot(
    folder: Path,
    stem: str,
    *,
    logger: Logger | None = None,
    upload: bool = False,
    snapshot: Callable[[], Snapshot] | None = None,
) -> list[Path]:
    """Write ``{stem}.pickle`` (for pytorch.org/memory_viz), ``{stem}-trace.html`` (the
    allocator's timeline: every live tensor over time) and ``{stem}-segments.html`` (the
    reserved segments and the blocks in them) into ``folder``.

    ``snapshot`` returns the allocator's state (default: ``torch.cuda.memory._snapshot``).
    Nothing is written when no allocation was recorded. With ``upload``, each file is
    also given to the logger's destinations (``upload_file("memory/<name>", path)``).
    """
    from torch.cuda import _memory_viz

    data = (snapshot or torch.cuda.memory._snapshot)()
    if not any(data.get("device_traces") or ()):
        log.info("no CUDA allocation was recorded, so no memory snapshot was written")
        return []
    paths = [folder / f"{stem}.pickle", folder / f"{stem}-trace.html"]
    paths.append(folder / f"{stem}-segments.html")
    with _partial(paths[0]) as file:
        pickle.dump(data, file)
    # The HTML pages embed the snapshot and load the viewer's script when opened.
    paths[1].write_text(_memory_viz.trace_plot(data), encoding="utf-8")
    paths[2].write_text(_memory_viz.segment_plot(data), encoding="utf-8")
    log.info("wrote the CUDA memory snapshot %s and its plots", paths[0])
    if upload and logger is not None:
        for path in paths:
            logger.upload_file(f"memory/{path.name}", path, overwrite=True)
    return paths


class _partial:
    """A binary file written under a temporary name and renamed when complete."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.temporary = path.with_name(f".{path.name}.partial")

    def __enter__(self) -> Any:
        self.file = self.temporary.open("wb")
        return self.file

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        self.file.close()
        if kind is None:
            os.replace(self.temporary, self.path)
        else:
            self.temporary.unlink(missing_ok=True)
