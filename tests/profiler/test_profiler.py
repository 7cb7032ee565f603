"""Profiler: cyclic schedule over the run's batches, Chrome traces per rank and merged."""

import json

import pytest

from multirank import run_ranks
from toy import blobs, loader, mlp
from trainkit.core import Callback, CallbackError, SingleProcess
from trainkit.profiler import Profiler, ProfilerConfig, merge_chrome_traces
from trainkit.trainer import Trainer


class Note(Callback):
    """A callback and an algorithm-free run: something for the markers to mark."""

    def batch_end(self, state, logger):
        pass


def _trainer(profiler, tmp_path, duration="8ba", **kwargs):
    return Trainer(
        model=mlp(),
        train_dataloader=loader(blobs(64)),  # 4 batches per epoch
        eval_dataloader=loader(blobs(16), shuffle=False),
        max_duration=duration,
        device="cpu",
        progress_bar=False,
        seed=0,
        run_name="prof",
        callbacks=[profiler, Note()],
        **kwargs,
    )


def _names(path):
    return {e["name"] for e in json.loads(path.read_text())["traceEvents"]}


def test_cyclic_schedule_writes_one_trace_per_cycle(tmp_path):
    profiler = Profiler(
        folder=tmp_path / "{run_name}", skip_first=1, wait=1, warmup=1, active=2, repeat=2
    )
    with _trainer(profiler, tmp_path, duration="12ba") as trainer:
        trainer.fit()
    # Batches 0..11: skip 0, wait 1, warm 2, record 3-4 (saved after 5 done), wait 5, ...
    assert [p.name for p in profiler.traces] == [
        "trace-batch5-rank0.json",
        "trace-batch9-rank0.json",
    ]
    assert all(p.parent == tmp_path / "prof" for p in profiler.traces)
    names = _names(profiler.traces[0])
    assert {"ProfilerStep#3", "ProfilerStep#4"} <= names  # numbered as the run's batches
    assert {
        "trainkit/forward",
        "trainkit/loss",
        "trainkit/backward",
        "trainkit/optimizer_step",
        "trainkit/dataloader",
        "trainkit/callback/Note/batch_end",
        "aten::addmm",
    } <= names


def test_markers_are_installed_for_the_cycles_only(tmp_path):
    seen = []

    class Note(Callback):
        def batch_end(self, state, logger):
            seen.append("batch_end" in vars(self))

    note = Note()
    trainer = Trainer(
        model=mlp(), train_dataloader=loader(blobs(64)), max_duration="4ba", device="cpu",
        progress_bar=False, callbacks=[Profiler(folder=tmp_path, wait=1, warmup=1, active=1), note],
    )  # fmt: skip
    trainer.fit()
    trainer.close()
    # Wrapped from the warm-up batch (1) on; the Profiler ends the cycle in its own batch_end
    # of batch 2, before Note's, which belongs to the next, unrecorded step.
    assert seen == [False, True, False, False]
    assert [type(c).__name__ for c in trainer.state.callbacks] == ["Profiler", "Note"]


def test_a_run_ending_mid_cycle_saves_what_it_recorded(tmp_path):
    profiler = Profiler(folder=tmp_path, warmup=0, active=10)
    with _trainer(profiler, tmp_path, duration="3ba") as trainer:
        trainer.fit()
    assert [p.name for p in profiler.traces] == ["trace-batch3-rank0.json"]
    assert "ProfilerStep#2" in _names(profiler.traces[0])


def test_the_schedule_continues_across_fit_calls_and_resumption(tmp_path):
    def run(*durations, load=None):
        profiler = Profiler(folder=tmp_path / "run", wait=2, warmup=1, active=1, repeat=0)
        trainer = _trainer(profiler, tmp_path, duration=None)
        if load is not None:
            trainer.state.load_state_dict(load)
        for duration in durations:
            trainer.fit(duration=duration)
        trainer.close()
        return [p.name for p in profiler.traces], trainer

    continuous, _ = run("9ba")
    assert continuous == ["trace-batch4-rank0.json", "trace-batch8-rank0.json"]
    assert run("3ba", "6ba")[0] == continuous
    first, trainer = run("5ba")
    assert first == continuous[:1]
    resumed, _ = run("4ba", load=trainer.state.state_dict())
    assert resumed == continuous[1:]


def test_zero_active_steps_and_negative_counts_are_clear_errors():
    with pytest.raises(ValueError, match=r"active=0 records nothing.*use active >= 1"):
        Profiler(active=0)
    with pytest.raises(ValueError, match="Profiler wait=-1 is not valid; use an int >= 0"):
        Profiler(wait=-1)
    with pytest.raises(ValueError, match=r"Profiler repeat=1\.5 is not valid"):
        ProfilerConfig(repeat=1.5)


def test_the_config_holds_the_folder_as_text(tmp_path):
    profiler = Profiler(ProfilerConfig(folder=tmp_path / "traces"), active=2)
    assert profiler.config.folder == str(tmp_path / "traces")
    assert profiler.config.active == 2


def test_an_unwritable_folder_fails_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(CallbackError, match="Profiler cannot create its trace folder"):
        _trainer(Profiler(folder=blocker / "traces"), tmp_path)


def _profile_two_ranks(rank, world_size, folder):
    profiler = Profiler(folder=folder, warmup=1, active=1)
    trainer = Trainer(
        model=mlp(), train_dataloader=loader(blobs(32)), max_duration="3ba", device="cpu",
        progress_bar=False, seed=0, run_name="dist", callbacks=[profiler],
        parallelism=SingleProcess(),  # replicas on purpose: no trainkit-parallel needed
    )  # fmt: skip
    trainer.fit()
    trainer.close()
    return [str(p) for p in profiler.traces], [str(p) for p in profiler.merged_traces]


def test_each_rank_writes_its_trace_and_rank_zero_merges_them(tmp_path):
    results = run_ranks(_profile_two_ranks, 2, str(tmp_path))
    assert [r[0] for r in results] == [
        [str(tmp_path / "trace-batch2-rank0.json")],
        [str(tmp_path / "trace-batch2-rank1.json")],
    ]
    assert results[0][1] == [str(tmp_path / "trace-batch2.json")] and results[1][1] == []
    merged = json.loads((tmp_path / "trace-batch2.json").read_text())
    process_names = {
        e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"
    }
    assert any(n.startswith("rank 0") for n in process_names)
    assert any(n.startswith("rank 1") for n in process_names)
    pids = {
        r: {
            e["pid"]
            for e in json.loads((tmp_path / f"trace-batch2-rank{r}.json").read_text())[
                "traceEvents"
            ]
        }
        for r in (0, 1)
    }
    assert len({e["pid"] for e in merged["traceEvents"]}) == len(pids[0]) + len(pids[1])


def test_merge_aligns_the_ranks_clocks(tmp_path):
    def trace(base_ns, pid, ts):
        return {
            "baseTimeNanoseconds": base_ns,
            "traceEvents": [
                {"ph": "X", "name": "step", "pid": pid, "tid": 1, "ts": ts, "dur": 5},
                {"ph": "s", "name": "flow", "id": 7, "pid": pid, "tid": 1, "ts": ts},
            ],
        }

    paths = []
    for rank, base in enumerate((2_000_000, 1_000_000)):
        paths.append(tmp_path / f"r{rank}.json")
        paths[-1].write_text(json.dumps(trace(base, pid=42, ts=10.0)))
    merged = json.loads(merge_chrome_traces(paths, tmp_path / "m.json").read_text())
    assert merged["baseTimeNanoseconds"] == 1_000_000
    steps = [e for e in merged["traceEvents"] if e["name"] == "step"]
    assert [(e["pid"], e["ts"]) for e in steps] == [(42, 1010.0), (10**8 + 42, 10.0)]
    flows = [e["id"] for e in merged["traceEvents"] if e["name"] == "flow"]
    assert len(set(flows)) == 2
