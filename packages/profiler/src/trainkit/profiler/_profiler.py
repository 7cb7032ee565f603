"""`Profiler`: torch.profiler on a cyclic schedule, Chrome traces per rank and merged."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerAction, ProfilerActivity

from trainkit.core import Callback, Event, Logger, State, dist
from trainkit.profiler._markers import Markers, PhaseMarkers
from trainkit.profiler._trace import merge_chrome_traces

__all__ = ["Profiler", "ProfilerConfig"]

_RECORDING = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
_SCHEDULE = ("skip_first", "wait", "warmup", "active", "repeat")


@dataclass(kw_only=True)
class ProfilerConfig:
    folder: str | Path = "runs/{run_name}/traces"
    """Where traces go; ``{run_name}`` and ``{rank}`` are filled in when the run starts
    (a `Path` is kept as its text)."""
    skip_first: int = 0
    """Batches of the run skipped before the first cycle."""
    wait: int = 0
    """Batches each cycle waits before warming up."""
    warmup: int = 1
    """Batches each cycle profiles without recording (the profiler's start-up cost)."""
    active: int = 3
    """Batches each cycle records (at least 1)."""
    repeat: int = 1
    """Cycles in all (0: until the end of the run)."""
    record_shapes: bool = False
    """Record the input shapes of operators (costs time while recording)."""
    profile_memory: bool = False
    """Record tensor allocations and frees (costs time while recording)."""
    with_stack: bool = False
    """Record the Python stack of each operator (costs time while recording)."""
    with_flops: bool = False
    """Estimate the FLOPs of matrix multiplications and convolutions."""
    memory_timeline: bool = False
    """Record the CUDA allocator's history per cycle, for pytorch.org/memory_viz (CUDA only)."""
    record_markers: bool = True
    """Mark the loop's phases, each algorithm and each callback with ``record_function``
    ranges while a cycle runs."""
    merge_ranks: bool = True
    """Have rank 0 merge the ranks' traces of each cycle into one timeline."""

    def __post_init__(self) -> None:
        self.folder = os.fspath(self.folder)
        for name in _SCHEDULE:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Profiler {name}={value!r} is not valid; use an int >= 0")
        if self.active == 0:
            raise ValueError(
                "Profiler active=0 records nothing: each cycle must record at least one batch; "
                "use active >= 1 (e.g. Profiler(wait=1, warmup=1, active=3))"
            )


class Profiler(Callback, config=ProfilerConfig):
    """Profiles training batches with `torch.profiler` on a cyclic schedule.

    Batches are numbered from 0 over the whole run: the first ``skip_first`` are skipped,
    then each cycle waits ``wait`` batches, warms up for ``warmup`` and records
    ``active``; ``repeat`` cycles in all (0: until the end). The schedule is a function of
    the run's batch count, so a resumed run continues it where it stopped. Outside the
    warm-up and recording batches no torch profiler exists at all, so the callback costs
    next to nothing.

    Each cycle writes ``{folder}/trace-batch{N}-rank{r}.json`` (N: batches done when it
    was saved), and with several ranks rank 0 also writes ``trace-batch{N}.json``, the
    ranks merged on one timeline (the folder must be shared by the ranks). Open them in
    ``chrome://tracing`` or https://ui.perfetto.dev. With ``memory_timeline`` on CUDA,
    ``memory-batch{N}-rank{r}.pickle`` holds the allocator's history for the cycle (open
    it in https://pytorch.org/memory_viz).

    While a cycle runs, ``record_function`` ranges mark the loop's phases
    (``trainkit/forward``, ``trainkit/backward``, ``trainkit/optimizer_step``, ...) and
    every algorithm and callback (``trainkit/callback/SpeedMonitor/batch_end``): the
    methods are wrapped on the instances for the cycle's batches only, and restored after.

    Options: `ProfilerConfig`.

    Raises:
        ValueError: a negative count, or ``active=0`` (nothing would be recorded).
    """

    config: ProfilerConfig
    required_events = (Event.INIT, Event.BATCH_START)

    def __init__(self, config: ProfilerConfig | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        config = self.config
        with warnings.catch_warnings():  # torch warns when warmup=0, which is a valid choice
            warnings.simplefilter("ignore")
            self.schedule = torch.profiler.schedule(
                **{name: getattr(config, name) for name in _SCHEDULE}
            )
        self.options = {
            "record_shapes": config.record_shapes,
            "profile_memory": config.profile_memory,
            "with_stack": config.with_stack,
            "with_flops": config.with_flops,
        }
        self.traces: list[Path] = []
        """Chrome traces written by this rank."""
        self.merged_traces: list[Path] = []
        """Merged traces written by this rank (rank 0, several ranks)."""
        self._state: State | None = None
        self._folder: Path | None = None
        self._profile: Any = None
        self._recorded = 0  # batches recorded in the current cycle
        self._markers = Markers(lambda: self._profile is not None)
        self._phases = PhaseMarkers(self._markers)

    @property
    def folder(self) -> Path:
        assert self._folder is not None, "the folder is known once the run has started"
        return self._folder

    def init(self, state: State, logger: Logger) -> None:
        self._state = state
        template = str(self.config.folder)
        try:
            folder = Path(template.format(run_name=state.run_name, rank=state.rank))
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(
                f"Profiler folder {template!r} is not a valid template ({err!r}); it may "
                "contain '{run_name}' and '{rank}', e.g. 'runs/{run_name}/traces'"
            ) from err
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OSError(
                f"Profiler cannot create its trace folder {str(folder)!r} ({err.strerror or err}); "
                "give a folder that can be written, e.g. Profiler('runs/{run_name}/traces')"
            ) from err
        self._folder = folder

    # --- the schedule --------------------------------------------------------------------

    def batch_start(self, state: State, logger: Logger) -> None:
        batch = state.timestamp.batch
        if self._profile is None and self.schedule(batch) != ProfilerAction.NONE:
            self._start(state, logger, batch)

    def batch_end(self, state: State, logger: Logger) -> None:
        if self._profile is None:
            return
        self._markers.phase(Event.BATCH_END)  # close the optimizer-step range before the step
        if self._profile.current_action in _RECORDING:
            self._recorded += 1
        self._profile.step()
        if self._profile.current_action == ProfilerAction.NONE:
            self._stop()

    def fit_end(self, state: State, logger: Logger) -> None:
        self._stop()

    def close(self, state: State | None = None, logger: Logger | None = None) -> None:
        self._stop()

    def _start(self, state: State, logger: Logger, batch: int) -> None:
        cuda = state.device.type == "cuda"
        self._recorded = 0
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self._profile = torch.profiler.profile(
            activities=activities,
            schedule=self.schedule,
            on_trace_ready=self._trace_ready,
            **self.options,
        )
        # Start at the run's batch number, so ProfilerStep#N is batch N of the run.
        self._profile.step_num = batch
        self._profile.current_action = self.schedule(batch)
        if self.config.memory_timeline and cuda:
            torch.cuda.memory._record_memory_history(max_entries=1_000_000)
        self._profile.start()
        if self.config.record_markers:
            others = [c for c in [*state.callbacks, *logger.destinations] if c is not self]
            self._markers.install(state.algorithms, others)
            state.callbacks.insert(0, self._phases)  # first: the phase encloses the others

    def _stop(self) -> None:
        if self._profile is None:
            return
        self._markers.close_all()
        self._markers.remove()
        if self._state is not None and self._phases in self._state.callbacks:
            self._state.callbacks.remove(self._phases)
        profile, self._profile = self._profile, None
        profile.stop()  # saves the cycle's trace if it was recording
        if self.config.memory_timeline and torch.cuda.is_available():
            torch.cuda.memory._record_memory_history(enabled=None)

    def _trace_ready(self, profile: Any) -> None:
        assert self._state is not None
        if self._recorded == 0:  # the fit ended as recording was about to start
            return
        self._recorded = 0
        batch, rank, world = self._state.timestamp.batch, dist.get_rank(), dist.get_world_size()
        path = self.folder / f"trace-batch{batch}-rank{rank}.json"
        profile.export_chrome_trace(str(path))
        self.traces.append(path)
        if self.config.memory_timeline and self._state.device.type == "cuda":
            snapshot = self.folder / f"memory-batch{batch}-rank{rank}.pickle"
            torch.cuda.memory._dump_snapshot(str(snapshot))
        if world > 1 and self.config.merge_ranks:
            dist.barrier()  # every rank reaches this at the same batch: the schedule is shared
            if rank == 0:
                self._merge(batch, world)

    def _merge(self, batch: int, world: int) -> None:
        paths = [self.folder / f"trace-batch{batch}-rank{r}.json" for r in range(world)]
        missing = [str(p) for p in paths if not p.exists()]
        if missing:
            warnings.warn(
                f"Profiler: no merged trace for batch {batch}; rank 0 cannot see {missing} "
                "(the trace folder must be shared by all ranks to merge)",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        self.merged_traces.append(
            merge_chrome_traces(paths, self.folder / f"trace-batch{batch}.json")
        )
