"""The goodput ledger across real SIGKILLs and resumes: lost steps, restarts, training time
and the records a run writes (trainkit-trainer's ledger in trainkit-checkpoint's folder),
and `trainkit plot` drawing it."""

import math

import pytest

from ckpt_runs import KillAt, in_child, takes_over_the_dead_run, trainer
from trainkit.loggers import FileLogger, InMemoryLogger
from trainkit.loggers.plot import _ledger_restarts, plot_run
from trainkit.trainer import _goodput
from trainkit.trainer.goodput import LEDGER, read_records, summarize

PNG = b"\x89PNG\r\n\x1a\n"


def _run(folder, *, callbacks=(), loggers=()):
    return trainer(
        folder,
        callbacks=callbacks,
        loggers=loggers,
        interval="4ba",
        max_duration="12ba",
        autoresume=True,
    )


def _killed_at(folder, batch, metrics_dir):
    _run(folder, callbacks=[KillAt(batch)], loggers=[FileLogger(folder=metrics_dir)]).fit()


def test_the_ledger_counts_lost_steps_and_restarts_across_sigkill_and_resume(tmp_path, monkeypatch):
    # Records only at the fixed points (start, first step, end of fit, close), none by time.
    monkeypatch.setattr(_goodput, "RECORD_INTERVAL_S", math.inf)
    folder, metrics_dir = tmp_path / "checkpoints", tmp_path
    assert in_child(_killed_at, folder, 6, metrics_dir) == -9  # saved at 4: 5 and 6 lost
    assert in_child(_killed_at, folder, 9, metrics_dir) == -9  # from 4, saved at 8: 9 lost
    memory = InMemoryLogger()
    with takes_over_the_dead_run():
        resumed = _run(folder, loggers=[memory, FileLogger(folder=metrics_dir)])
        assert resumed.state.timestamp.batch == 8
        resumed.fit()
    resumed.close()

    records = read_records(folder)
    # One record per point of each process's life and per checkpoint, none per step; a
    # killed process's last step comes from its heartbeat, recorded by the next process.
    assert [(r["event"], r["n"], r["batch"]) for r in records] == [
        ("start", 0, 0),
        ("first_step", 0, 1),
        ("checkpoint", 0, 4),
        ("beat", 0, 6),
        ("start", 1, 4),
        ("first_step", 1, 5),
        ("checkpoint", 1, 8),
        ("beat", 1, 9),
        ("start", 2, 8),
        ("first_step", 2, 9),
        ("progress", 2, 12),
        ("checkpoint", 2, 12),  # saved at FIT_END, after the fit's record
        ("end", 2, 12),
        ("beat", 2, 12),
    ]
    summary = summarize(records)
    assert [(p.first_batch, p.last_batch) for p in summary.processes] == [(0, 6), (4, 9), (8, 12)]
    assert summary.processes[0].resumed_from is None
    assert [p.resumed_from.endswith(("-ba4", "-ba8")) for p in summary.processes[1:]] == [True] * 2
    assert summary.restarts == 2 and summary.lost_steps == 3  # batches 5, 6 and 9
    # The time lost is each killed process's clock past the checkpoint the next resumed from.
    at = {(r["event"], r["n"]): r["wct"] for r in records}
    lost = (at["beat", 0] - at["start", 1]) + (at["beat", 1] - at["start", 2])
    assert summary.lost_s == pytest.approx(lost) and summary.lost_s > 0
    assert 0 < summary.fraction <= 1
    assert summary.fraction == pytest.approx(summary.train_s / summary.wall_s)
    # The kept steps are the final run's history, each once: its clock at the end.
    assert summary.train_s == pytest.approx(resumed.state.timestamp.total_wct)
    for process in summary.processes:
        assert {"prepare", "load", "first_step"} <= set(process.restart_s)
        assert sum(process.restart_s.values()) <= process.wall_s

    # The last process logged what the ledger says: two restarts, three steps lost.
    assert memory.latest["goodput/restarts"] == 2
    assert memory.latest["goodput/lost_steps"] == 3
    assert 0 < memory.latest["goodput/fraction"] <= 1

    # `trainkit plot` finds the ledger in the run's checkpoints/ and draws every process
    # start's restart, the killed ones' too (their buffered metrics died with them).
    written = plot_run(metrics_dir)
    assert metrics_dir / "goodput.png" in written
    assert (metrics_dir / "goodput.png").read_bytes().startswith(PNG)
    restarts = _ledger_restarts(folder / LEDGER)
    assert [label for label, _ in restarts] == ["from ba 0", "from ba 4", "from ba 8"]
    assert [parts for _, parts in restarts] == [p.restart_s for p in summary.processes]


def test_a_ledger_that_cannot_be_written_is_said_once_and_training_goes_on(tmp_path):
    folder = tmp_path / "checkpoints"
    (folder / LEDGER).mkdir(parents=True)  # in the way: no file can be written there
    memory = InMemoryLogger()
    run = trainer(folder, loggers=[memory], max_duration="3ba")
    # Said once the run's first FIT_START has passed (the ledger is opened there).
    with pytest.warns(RuntimeWarning, match=r"cannot keep the goodput ledger in .*checkpoints"):
        run.fit()
    run.close()
    assert run.state.timestamp.batch == 3
    assert 0 < memory.latest["goodput/fraction"] <= 1  # counted for this process alone
    assert memory.latest["goodput/restarts"] == 0
