"""Goodput in every Trainer run: the ``goodput/...`` metrics, the restart parts, which steps
count, and how a ledger's records add up (`trainkit.trainer.goodput`)."""

import contextlib
import faulthandler
import math

import pytest
import torch

from multirank import fork_context, run_ranks
from toy import blobs, loader, mlp
from trainkit.core import Callback, LoggerDestination, ParallelStrategy, Timestamp
from trainkit.trainer import Trainer, _goodput
from trainkit.trainer.goodput import BEAT, BEAT_MAGIC, decode_beat, summarize

EAGER = {"backend": "eager"}  # Dynamo alone: the cheapest compile there is


class Metrics(LoggerDestination):
    def __init__(self, counter=None):
        self.logged = []  # (step, metrics, steps run when logged)
        self.counter = counter

    def log_metrics(self, metrics, step):
        self.logged.append((step, dict(metrics), self.counter.calls if self.counter else None))

    def goodput(self):
        return [(step, m, calls) for step, m, calls in self.logged if "goodput/fraction" in m]


def run(*, destinations=(), callbacks=(), max_duration="6ba", **kwargs):
    model = mlp(dropout=0.0)
    trainer = Trainer(
        model=model,
        train_dataloader=loader(blobs(128), shuffle=False),
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        max_duration=max_duration,
        loggers=list(destinations),
        callbacks=list(callbacks),
        device="cpu",
        seed=0,
        progress_bar=False,
        **kwargs,
    )
    trainer.fit()
    trainer.close()
    return trainer


def restart_parts(metrics):
    prefix = "goodput/restart_s/"
    return {k.removeprefix(prefix): v for k, v in metrics.items() if k.startswith(prefix)}


def test_a_run_logs_goodput_at_its_first_step_and_at_the_end_of_fit(monkeypatch):
    monkeypatch.setattr(_goodput, "RECORD_INTERVAL_S", math.inf)  # no record by time
    destination = Metrics()
    trainer = run(destinations=[destination])
    logged = destination.goodput()
    assert [step for step, _, _ in logged] == [1, 6]
    first, last = logged[0][1], logged[-1][1]
    parts = restart_parts(first)
    assert {"prepare", "load", "first_step", "total"} <= set(parts)
    assert "compile" not in parts
    assert all(seconds >= 0 for seconds in parts.values())
    total = parts.pop("total")
    assert total == pytest.approx(sum(parts.values()))
    for metrics in (first, last):
        assert 0 < metrics["goodput/fraction"] <= 1
        assert metrics["goodput/lost_steps"] == 0 and metrics["goodput/restarts"] == 0
        assert metrics["goodput/fraction"] == pytest.approx(
            metrics["goodput/train_s"] / metrics["goodput/wall_s"]
        )
    # Training time is the run's own clock: the Timestamp's, at the end of the fit.
    assert last["goodput/train_s"] == pytest.approx(trainer.state.timestamp.total_wct)
    assert not restart_parts(last)  # the restart is reported once


def test_goodput_is_logged_every_interval(monkeypatch):
    monkeypatch.setattr(_goodput, "RECORD_INTERVAL_S", 0.0)
    destination = Metrics()
    run(destinations=[destination], max_duration="4ba")
    assert [step for step, _, _ in destination.goodput()] == [1, 2, 3, 4, 4]  # + fit's end


class CountSteps(Callback):
    def __init__(self):
        self.calls = 0

    def batch_end(self, state, logger):
        self.calls += 1


class CommitFromStep(Callback):
    """Acts as a fault-tolerant strategy that does not commit the first ``skipped`` steps:
    it puts the batch count back at BATCH_END (the contract with trainkit-parallel's)."""

    def __init__(self, skipped):
        self.skipped, self.seen = skipped, 0

    def batch_end(self, state, logger):
        self.seen += 1
        if self.seen <= self.skipped:
            state.timestamp = Timestamp()


def test_a_step_that_is_not_committed_is_not_counted():
    counter = CountSteps()
    destination = Metrics(counter)
    run(destinations=[destination], callbacks=[CommitFromStep(3), counter], max_duration="3ba")
    logged = destination.goodput()
    # The first step that advanced the batch count was the 4th one run: the restart ends there.
    first_step, metrics, calls = logged[0]
    assert (first_step, calls) == (1, 4)
    assert "goodput/restart_s/first_step" in metrics
    assert counter.calls == 6 and logged[-1][0] == 3


def test_a_compiled_run_reports_its_first_step_as_compile():
    destination = Metrics()
    run(destinations=[destination], max_duration="2ba", compile=EAGER)
    parts = restart_parts(destination.goodput()[0][1])
    assert parts["compile"] > 0 and "first_step" not in parts


class NeedsGroup(ParallelStrategy):
    """A strategy that asks for a process group: the Trainer starts a one-rank one."""

    needs_process_group = True
    data_parallel_size = 1

    def prepare(self, state):
        pass

    def no_sync(self, model):
        return contextlib.nullcontext()

    def unwrap(self, model):
        return model


def _rendezvous_parts(sender):
    import torch.distributed as tdist

    try:
        destination = Metrics()
        run(destinations=[destination], parallelism=NeedsGroup(), max_duration="2ba")
        sender.send(restart_parts(destination.goodput()[0][1]))
    finally:
        if tdist.is_initialized():
            tdist.destroy_process_group()


def test_the_process_group_start_is_reported_as_the_rendezvous():
    receiver, sender = fork_context().Pipe(duplex=False)

    def child():
        torch.set_num_threads(1)
        faulthandler.dump_traceback_later(60, exit=True)
        _rendezvous_parts(sender)

    process = fork_context().Process(target=child)
    process.start()
    process.join(90)
    if process.is_alive():
        process.kill()
    assert process.exitcode == 0 and receiver.poll()
    parts = receiver.recv()
    assert parts["rendezvous"] > 0
    total = parts.pop("total")
    assert total == pytest.approx(sum(parts.values()))


def _goodput_keys_logged(rank, world_size):
    destination = Metrics()
    run(destinations=[destination], parallelism=NeedsGroup(), max_duration="2ba")
    return sorted({k for _, metrics, _ in destination.logged for k in metrics if "goodput" in k})


def test_rank_0_alone_keeps_and_logs_goodput():
    rank0, rank1 = run_ranks(_goodput_keys_logged, 2)
    assert "goodput/fraction" in rank0 and "goodput/restart_s/total" in rank0
    assert rank1 == []


# --- a ledger's records, added up ----------------------------------------------------------


def _start(n, *, started, at, batch, wct, resumed_from="ckpt", run="a"):
    return {"event": "start", "n": n, "run": run, "started": started, "at": at,
            "batch": batch, "wct": wct, "resumed_from": resumed_from, "parts": {"load": 1.0}}  # fmt: skip


def _at(event, n, *, at, batch, wct):
    return {"event": event, "n": n, "at": at, "batch": batch, "wct": wct}


def test_steps_after_the_checkpoint_resumed_from_are_lost_and_not_training_time():
    records = [
        _start(0, started=90.0, at=100.0, batch=0, wct=0.0, resumed_from=None),
        _at("first_step", 0, at=101.0, batch=1, wct=1.0),
        _at("beat", 0, at=112.0, batch=10, wct=8.0),  # killed after batch 10
        _start(1, started=120.0, at=125.0, batch=6, wct=5.0),  # resumed at batch 6
        _at("progress", 1, at=130.0, batch=12, wct=9.0),
        _at("end", 1, at=140.0, batch=20, wct=15.0),
    ]
    summary = summarize(records)
    assert summary.lost_steps == 4 and summary.lost_s == pytest.approx(3.0)
    assert summary.restarts == 1
    # Kept: batches 1-6 of the first process and 7-20 of the second: the final clock.
    assert summary.train_s == pytest.approx(15.0)
    assert summary.wall_s == pytest.approx((112.0 - 90.0) + (140.0 - 120.0))
    assert summary.fraction == pytest.approx(15.0 / 42.0)
    assert [p.restart_s for p in summary.processes] == [{"load": 1.0}, {"load": 1.0}]


def test_a_fresh_start_of_the_same_run_loses_every_step_and_another_run_starts_a_new_ledger():
    first = [
        _start(0, started=0.0, at=1.0, batch=0, wct=0.0, resumed_from=None),
        _at("beat", 0, at=5.0, batch=3, wct=3.0),  # killed before its first checkpoint
    ]
    again = _start(1, started=6.0, at=7.0, batch=0, wct=0.0, resumed_from=None)
    restarted = summarize([*first, again, _at("end", 1, at=10.0, batch=3, wct=3.0)])
    assert (restarted.lost_steps, restarted.restarts) == (3, 1)
    assert restarted.train_s == pytest.approx(3.0)
    other = {**again, "run": "b"}
    alone = summarize([*first, other, _at("end", 1, at=10.0, batch=3, wct=3.0)])
    assert (alone.lost_steps, alone.restarts, alone.wall_s) == (0, 0, 4.0)


def test_a_torn_heartbeat_is_ignored():
    whole = BEAT_MAGIC + BEAT.pack(2, 7, 100.0, 6.5, 2)
    assert decode_beat(whole) == {"event": "beat", "n": 2, "at": 100.0, "batch": 7, "wct": 6.5}
    torn = BEAT_MAGIC + BEAT.pack(2, 7, 100.0, 6.5, 1)  # killed between the two stores
    assert decode_beat(torn) is None
    assert decode_beat(b"\0" * len(whole)) is None
    assert summarize([]).fraction == 0.0 and not math.isnan(summarize([]).fraction)
