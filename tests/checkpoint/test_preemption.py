"""A preempted run (SIGTERM, SIGINT) saves, exits with status 75 and resumes bitwise.

Real signals are sent to real processes: each run is a forked child that signals itself
at a batch drawn at random (two ranks: tests/integration/test_preemption_two_ranks.py) (seeded by the test's id, so a
failure reproduces). The grace period is checked through its effect: a save that cannot
finish in time is abandoned (the test's writer waits until it is), and the previous
checkpoint stays the latest.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import time

import pytest
import torch

from ckpt_runs import in_child_with_reply, writes_into
from toy import blobs, flat_params, loader, mlp
from trainkit.checkpoint import Checkpointer, _write, list_checkpoints
from trainkit.core import PREEMPTED_EXIT_CODE, Callback, TrainingPreempted
from trainkit.trainer import Trainer

BATCHES = 24  # 3 epochs of 8 batches
LAG = 2  # on several ranks, all stop this many batches after the signal (docs/architecture.md)


def _trainer(folder, *, callbacks=(), grace=120.0, signals=None, **checkpointer) -> Trainer:
    """ckpt_runs.trainer's run, with the Trainer's preemption options."""
    model = mlp(dropout=0.2)
    options = {} if signals is None else {"preemption_signals": signals}
    extra = [Checkpointer(folder=folder, **checkpointer)] if folder is not None else []
    return Trainer(
        model=model,
        train_dataloader=loader(blobs(128)),
        optimizers=torch.optim.AdamW(model.parameters(), lr=0.01),
        max_duration="3ep",
        callbacks=[*extra, *callbacks],
        device_train_microbatch_size=8,
        progress_bar=False,
        device="cpu",
        seed=11,
        preemption_grace_period=grace,
        **options,
    )


class SignalAt(Callback):
    """Sends ``sig`` to this thread at the end of batch ``batch`` (on ``rank`` only); the
    handler has run before ``raise_signal`` returns (see tests/trainer/test_preemption.py)."""

    def __init__(self, batch, sig, rank=None):
        self.batch, self.sig, self.rank = batch, sig, rank

    def batch_end(self, state, logger):
        if state.timestamp.batch == self.batch and self.rank in (None, state.rank):
            signal.raise_signal(self.sig)


def _preempted_run(sender, folder, batch, sig, async_save):
    try:
        _trainer(
            folder, callbacks=[SignalAt(batch, sig)], interval="5ba", async_save=async_save
        ).fit()
    except TrainingPreempted as err:
        sender.send((err.request.batch, err.request.checkpoint, err.request.abandoned))
        raise  # the process exits with its status, as a script's would


def _reference_params():
    run = _trainer(None)
    run.fit()
    return flat_params(run.state.model)


def _resumed_params(folder, at):
    resumed = _trainer(folder, interval="5ba", autoresume=True)
    assert resumed.state.timestamp.batch == at
    resumed.fit()
    return flat_params(resumed.state.model)


def _batch(*key, last: int = BATCHES - 1) -> int:
    """A batch to signal at, drawn from the test's own seed (so a failure reproduces)."""
    return random.Random(repr(key)).randint(1, last)


def _name(batch: int) -> str:
    # A run stopped after an epoch's last batch has not started the next epoch.
    return f"ep{(batch - 1) // 8}-ba{batch}"


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_one_rank_preempted_at_a_random_batch_saves_exits_75_and_resumes_bitwise(
    tmp_path, sig, async_save
):
    batch = _batch(sig, async_save, 1)
    status, sent = in_child_with_reply(_preempted_run, tmp_path, batch, sig, async_save)
    assert status == PREEMPTED_EXIT_CODE == 75, f"signalled at batch {batch}"
    stopped, checkpoint, abandoned = sent
    assert stopped == batch  # one rank stops after the batch it was signalled in
    assert abandoned == "" and checkpoint == str(tmp_path / _name(batch))
    assert (tmp_path / "latest").read_text() == f"{_name(batch)}\n"
    assert torch.equal(_resumed_params(tmp_path, batch), _reference_params())


def _signal_again_while_saving(sender, folder, batch):
    write = _write._DigestingStream.write
    sent = []

    def write_and_signal(stream, data):
        if writes_into(stream, _name(batch)) and not sent:
            sent.append(True)
            signal.raise_signal(signal.SIGTERM)  # mid-save: must change nothing
            signal.raise_signal(signal.SIGINT)
        return write(stream, data)

    _write._DigestingStream.write = write_and_signal
    _preempted_run(sender, folder, batch, signal.SIGTERM, False)


def test_a_second_signal_during_the_save_leaves_a_loadable_checkpoint(tmp_path, caplog):
    batch = _batch("again")
    status, (stopped, checkpoint, abandoned) = in_child_with_reply(
        _signal_again_while_saving, tmp_path, batch
    )
    assert status == PREEMPTED_EXIT_CODE
    assert stopped == batch and checkpoint and not abandoned
    assert (tmp_path / "latest").read_text() == f"{_name(batch)}\n"
    assert torch.equal(_resumed_params(tmp_path, batch), _reference_params())


def _too_slow_to_save(sender, folder, batch, grace):
    checkpointer = Checkpointer(folder=folder, interval="2ba")
    write = _write._DigestingStream.write

    def write_until_abandoned(stream, data):
        if writes_into(stream, _name(batch)):
            # The save cannot finish: only the end of the grace period lets it go on.
            deadline = time.monotonic() + 60
            while not checkpointer._cancel.is_set() and time.monotonic() < deadline:
                time.sleep(0.01)
        return write(stream, data)

    _write._DigestingStream.write = write_until_abandoned
    run = _trainer(None, grace=grace, callbacks=[checkpointer, SignalAt(batch, signal.SIGTERM)])
    try:
        run.fit()
    except TrainingPreempted as err:
        sender.send((err.request.batch, err.request.checkpoint, err.request.abandoned))
        raise


@pytest.mark.parametrize("grace", [0.3, 0.0])
def test_a_grace_period_too_short_keeps_the_previous_checkpoint_the_latest(tmp_path, grace):
    batch = 7  # the interval saved batch 6 before
    status, (stopped, checkpoint, abandoned) = in_child_with_reply(
        _too_slow_to_save, tmp_path, batch, grace
    )
    assert status == PREEMPTED_EXIT_CODE
    assert stopped == batch and checkpoint == ""
    assert "was abandoned" in abandoned and "grace period" in abandoned
    assert (tmp_path / "latest").read_text() == "ep0-ba6\n"
    assert sorted(p.name for p in list_checkpoints(tmp_path)) == ["ep0-ba2", "ep0-ba4", "ep0-ba6"]
    unpublished = [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]
    assert all(n.startswith(".tmp-ep0-ba7-") for n in unpublished)  # never read as a checkpoint
    resumed = _trainer(tmp_path, interval="2ba", autoresume=True)
    assert resumed.state.timestamp.batch == 6
    resumed.fit(duration="2ba")
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]  # cleared by its save


def _report_time(sender, folder):
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("trainkit").addHandler(handler)
    run = _trainer(folder, callbacks=[SignalAt(3, signal.SIGTERM)], interval="5ba")
    try:
        run.fit()
    except TrainingPreempted as err:
        sender.send((records, err.seconds))
        raise


def test_the_time_from_signal_to_exit_is_logged(tmp_path):
    status, (records, seconds) = in_child_with_reply(_report_time, tmp_path)
    assert status == PREEMPTED_EXIT_CODE
    assert records[0].startswith("received SIGTERM: finishing the current batch")
    assert records[1] == "preempted: saving a checkpoint of batch 3 (every rank)"
    assert records[-1] == (
        f"preempted by SIGTERM after batch 3, checkpoint {tmp_path / 'ep0-ba3'} saved: "
        f"{seconds:.2f} s from the signal to exit (grace period 120 s)"
    )


def test_a_configured_signal_preempts_and_the_defaults_then_do_not(tmp_path):
    run = _trainer(tmp_path, callbacks=[SignalAt(2, signal.SIGUSR1)], signals=["SIGUSR1"])
    previous = signal.getsignal(signal.SIGUSR1)
    with pytest.raises(TrainingPreempted) as caught:
        run.fit()
    assert caught.value.code == 75 and caught.value.request.signal == "SIGUSR1"
    assert signal.getsignal(signal.SIGUSR1) is previous  # restored after fit
    assert (tmp_path / "latest").read_text() == "ep0-ba2\n"


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_preempted_on_s3_the_preemption_checkpoint_is_the_latest_and_resumes_bitwise(
    s3, tmp_path, async_save
):
    url = f"{s3.url}/run"
    options = {"storage_options": s3.options, "local_dir": tmp_path}
    run = _trainer(
        url,
        callbacks=[SignalAt(5, signal.SIGTERM)],
        interval="3ba",
        async_save=async_save,
        **options,
    )
    with pytest.raises(TrainingPreempted) as caught:
        run.fit()  # in this process: the signal reaches fit's handler in the main thread
    assert caught.value.code == PREEMPTED_EXIT_CODE
    assert caught.value.request.checkpoint == f"{url}/ep0-ba5"
    assert s3.client.get_object(Bucket=s3.bucket, Key="run/latest")["Body"].read() == b"ep0-ba5\n"
    resumed = _trainer(url, interval="3ba", autoresume=True, **options)
    assert resumed.state.timestamp.batch == 5
    resumed.fit()
    assert torch.equal(flat_params(resumed.state.model), _reference_params())
