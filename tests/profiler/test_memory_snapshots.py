"""MemorySnapshot and OOMObserver: CUDA allocator snapshots at chosen batches and on
out-of-memory errors; on CPU a no-op with one info line.

On CPU the allocator's recording is replaced by a fake (what the callbacks do and write is
checked); the `gpu` tests record a real CUDA allocator.
"""

import logging
import pickle

import pytest
import torch

from toy import blobs, loader, mlp
from trainkit.core import Callback, LoggerDestination
from trainkit.profiler import MemorySnapshot, OOMObserver, _memory_snapshot, _oom_observer
from trainkit.profiler._snapshot_files import write_snapshot
from trainkit.trainer import Trainer

FAKE_SNAPSHOT = {
    "segments": [],
    "device_traces": [
        [{"action": "alloc", "addr": 1024, "size": 512, "stream": 0, "frames": [], "time_us": 1}]
    ],
}


class Uploads(LoggerDestination):
    def __init__(self):
        self.files = []

    def upload_file(self, name, path, overwrite=False):
        self.files.append((name, path.name, overwrite))


def _fit(tmp_path, *callbacks, duration="6ba", loggers=(), device="cpu"):
    trainer = Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(64)),
        max_duration=duration,
        device=device,
        progress_bar=False,
        run_name="demo",
        seed=0,
        callbacks=list(callbacks),
        loggers=list(loggers),
    )
    trainer.fit()
    trainer.close()


class FakeAllocator:
    """Stands in for the CUDA allocator's recording on a CPU run."""

    def __init__(self, monkeypatch, *modules):
        self.calls = []  # ("start", batches done) / ("stop", batches done)
        self.observers = []
        self.batches_done = 0
        for module in modules:
            monkeypatch.setattr(module, "cuda_run", lambda owner, state: True)
        monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", self._record)
        monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: FAKE_SNAPSHOT)
        monkeypatch.setattr(
            torch._C, "_cuda_attach_out_of_memory_observer", self.observers.append, raising=False
        )

    def _record(self, enabled="all", **options):
        self.calls.append(("stop" if enabled is None else "start", self.batches_done))


class CountBatches(Callback):
    def __init__(self, allocator):
        self.allocator = allocator

    def batch_end(self, state, logger):
        self.allocator.batches_done = state.timestamp.batch


def test_snapshot_files_are_the_pickle_and_two_html_views(tmp_path):
    paths = write_snapshot(tmp_path, "memory-batch3-rank0", snapshot=lambda: FAKE_SNAPSHOT)
    assert [p.name for p in paths] == [
        "memory-batch3-rank0.pickle",
        "memory-batch3-rank0-trace.html",
        "memory-batch3-rank0-segments.html",
    ]
    with paths[0].open("rb") as file:
        assert pickle.load(file) == FAKE_SNAPSHOT
    for page in paths[1:]:
        assert page.read_text().lstrip().lower().startswith("<!doctype html")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)


def test_nothing_is_written_when_nothing_was_recorded(tmp_path):
    empty = {"segments": [], "device_traces": [[]]}
    assert write_snapshot(tmp_path, "x", snapshot=lambda: empty) == []
    assert list(tmp_path.iterdir()) == []


def test_memory_snapshot_records_the_chosen_batches_then_writes(tmp_path, monkeypatch):
    allocator = FakeAllocator(monkeypatch, _memory_snapshot)
    snapshot = MemorySnapshot(
        skip_batches=2, record_batches=3, folder=tmp_path / "{run_name}", upload=True
    )
    uploads = Uploads()
    _fit(tmp_path, CountBatches(allocator), snapshot, loggers=[uploads], duration="8ba")
    # Started before batch 3 (2 done), stopped after batch 5, once.
    assert allocator.calls == [("start", 2), ("stop", 5)]
    assert [p.name for p in snapshot.files] == [
        "memory-batch5-rank0.pickle",
        "memory-batch5-rank0-trace.html",
        "memory-batch5-rank0-segments.html",
    ]
    assert all(p.parent == tmp_path / "demo" and p.exists() for p in snapshot.files)
    assert uploads.files == [(f"memory/{p.name}", p.name, True) for p in snapshot.files]


def test_memory_snapshot_writes_what_it_has_when_training_ends_first(tmp_path, monkeypatch):
    allocator = FakeAllocator(monkeypatch, _memory_snapshot)
    snapshot = MemorySnapshot(skip_batches=1, record_batches=10, folder=tmp_path)
    _fit(tmp_path, CountBatches(allocator), snapshot, duration="4ba")
    assert allocator.calls == [("start", 1), ("stop", 4)]
    assert snapshot.files[0].name == "memory-batch4-rank0.pickle"


def test_oom_observer_writes_once_per_batch_that_ran_out(tmp_path, monkeypatch):
    allocator = FakeAllocator(monkeypatch, _oom_observer)
    observer = OOMObserver(folder=tmp_path)

    class RunOutAtBatch3(Callback):
        def before_forward(self, state, logger):
            if state.timestamp.batch == 2:  # batch 3 is running
                for notify in allocator.observers:
                    notify(0, 2**40, 2**30, 0)
                    notify(0, 2**39, 2**30, 0)  # a retry at the same batch

    _fit(tmp_path, observer, RunOutAtBatch3(), duration="4ba")
    assert allocator.calls == [("start", 0), ("stop", 0)]  # the whole run, until close
    assert [p.name for p in observer.files] == [
        "oom-batch3-rank0.pickle",
        "oom-batch3-rank0-trace.html",
        "oom-batch3-rank0-segments.html",
    ]
    for notify in allocator.observers:  # closed: later errors write nothing
        notify(0, 1, 1, 0)
    assert len(list(tmp_path.iterdir())) == 3


@pytest.mark.parametrize("callback", [MemorySnapshot, OOMObserver])
def test_on_cpu_a_single_info_line_and_nothing_else(tmp_path, caplog, callback):
    with caplog.at_level(logging.DEBUG, logger="trainkit"):
        instance = callback(folder=tmp_path / "memory")
        _fit(tmp_path, instance, duration="5ba")
        recorded = [r for r in caplog.records if r.name.startswith("trainkit.profiler")]
    assert [(r.levelname, r.getMessage()) for r in recorded] == [
        (
            "INFO",
            f"{callback.__name__} does nothing in this run: it records the CUDA allocator, "
            "and the run is on cpu",
        )
    ]
    assert not (tmp_path / "memory").exists()
    assert instance.files == []


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="MemorySnapshot record_batches=0 is not valid"):
        MemorySnapshot(record_batches=0)
    with pytest.raises(ValueError, match="MemorySnapshot skip_batches=-1 is not valid"):
        MemorySnapshot(skip_batches=-1)
    with pytest.raises(ValueError, match="OOMObserver max_entries=0 is not valid"):
        OOMObserver(max_entries=0)


@pytest.mark.gpu
def test_memory_snapshot_of_a_cuda_run(tmp_path):
    snapshot = MemorySnapshot(skip_batches=1, record_batches=2, folder=tmp_path)
    _fit(tmp_path, snapshot, duration="4ba", device="cuda")
    assert snapshot.files[0].name == "memory-batch3-rank0.pickle"
    with snapshot.files[0].open("rb") as file:
        data = pickle.load(file)
    events = [e for trace in data["device_traces"] for e in trace]
    assert {"alloc", "free_completed"} <= {e["action"] for e in events}
    assert all(p.stat().st_size > 0 for p in snapshot.files)


@pytest.mark.gpu
def test_oom_observer_on_a_real_cuda_out_of_memory(tmp_path):
    observer = OOMObserver(folder=tmp_path)

    class Huge(Callback):
        def before_forward(self, state, logger):
            if state.timestamp.batch == 1:
                torch.empty(2**50, dtype=torch.uint8, device="cuda")  # a petabyte

    with pytest.raises(torch.OutOfMemoryError):
        _fit(tmp_path, observer, Huge(), duration="3ba", device="cuda")
    observer.close()
    assert [p.name for p in observer.files] == [
        "oom-batch2-rank0.pickle",
        "oom-batch2-rank0-trace.html",
        "oom-batch2-rank0-segments.html",
    ]
    with observer.files[0].open("rb") as file:
        assert any(pickle.load(file)["device_traces"])
