"""A run holds its checkpoint folder: a second run there refuses, naming the holder."""

import json
import os
import re
import socket
import threading
import time
import warnings

import pytest
import torch

from ckpt_runs import KillAt, in_child, trainer
from multirank import fork_context
from toy import flat_params
from trainkit.checkpoint import (
    ConditionalStorage,
    FolderLock,
    FolderLockedError,
    LocalStorage,
    list_checkpoints,
    load_checkpoint,
    open_storage,
)
from trainkit.core import Callback

LOCK = ".trainkit-lock"


class HoldAt(Callback):
    """At batch ``batch``, says so (``holding``) and waits for ``finish`` (at most 60 s)."""

    def __init__(self, batch, holding, finish):
        self.batch, self.holding, self.finish = batch, holding, finish

    def batch_end(self, state, logger):
        if state.timestamp.batch == self.batch:
            self.holding.set()
            self.finish.wait(60)


def _cause(err):
    return err.__cause__ if err.__cause__ is not None else err


def _run_in_child(folder, go, holding, finish, results):
    torch.set_num_threads(1)
    go.wait(60)
    try:
        trainer(
            folder, interval="2ba", max_duration="6ba", callbacks=[HoldAt(3, holding, finish)]
        ).fit()
        results.send(("ok", os.getpid(), ""))
    except Exception as err:
        results.send((type(_cause(err)).__name__, os.getpid(), str(_cause(err))))


@pytest.mark.parametrize("kind", ["local", "fsspec-file"])
def test_two_runs_started_together_one_refuses_naming_the_other(tmp_path, kind):
    # The same folder, as a path (LocalStorage) or through fsspec's local file system.
    folder = tmp_path if kind == "local" else f"fsspec+file://{tmp_path}"
    ctx = fork_context()
    go, holding, finish = ctx.Event(), ctx.Event(), ctx.Event()
    receiver, sender = ctx.Pipe(duplex=False)
    procs = [
        ctx.Process(target=_run_in_child, args=(folder, go, holding, finish, sender))
        for _ in range(2)
    ]
    for proc in procs:
        proc.start()
    go.set()  # both start now
    try:
        assert receiver.poll(60), "neither run finished or refused"
        first = receiver.recv()  # the refused one: the other holds at batch 3
        finish.set()
        assert receiver.poll(60)
        second = receiver.recv()
    finally:
        finish.set()
        for proc in procs:
            proc.join(60)
    (kind, loser, message), (other, winner, _) = first, second
    assert kind == "FolderLockedError" and other == "ok", (first, second)
    assert (
        "held by run 'run-" in message
        and f"(pid {winner} on host {socket.gethostname()}" in message
    )
    assert loser != winner
    # The winner's work is whole: every checkpoint it wrote, and latest naming its last.
    names = [str(p).rsplit("/", 1)[1] for p in list_checkpoints(folder)]
    assert names == ["ep0-ba6", "ep0-ba4", "ep0-ba2"]
    assert (tmp_path / "latest").read_text() == "ep0-ba6\n"
    assert not (tmp_path / LOCK).exists()  # released at the end of fit


def test_a_run_started_while_another_holds_the_folder_refuses_then_starts_after(tmp_path):
    ctx = fork_context()
    go, holding, finish = ctx.Event(), ctx.Event(), ctx.Event()
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_run_in_child, args=(tmp_path, go, holding, finish, sender))
    proc.start()
    go.set()
    try:
        assert holding.wait(60), "the first run never got to batch 3"
        for options in ({}, {"autoresume": True}):  # resuming does not take a live run's folder
            with pytest.raises(Exception) as refused:
                trainer(tmp_path, interval="2ba", max_duration="6ba", **options).fit()
            cause = _cause(refused.value)
            assert isinstance(cause, FolderLockedError)
            assert f"(pid {proc.pid} on host" in str(cause) and "lock_wait" in str(cause)
        finish.set()
        assert receiver.poll(60) and receiver.recv()[0] == "ok"
    finally:
        finish.set()
        proc.join(60)
    reference = trainer(max_duration="6ba")
    reference.fit()
    resumed = trainer(tmp_path, interval="2ba", max_duration="6ba", autoresume=True)
    assert resumed.state.timestamp.batch == 6  # the first run's final state is intact
    assert torch.equal(flat_params(resumed.state.model), flat_params(reference.state.model))


def test_two_trainers_in_one_process(tmp_path):
    refused = []

    class StartAnother(Callback):
        def batch_end(self, state, logger):
            if state.timestamp.batch == 2:
                try:
                    trainer(tmp_path, interval="2ba", max_duration="6ba").fit()
                except Exception as err:
                    refused.append(_cause(err))

    trainer(tmp_path, interval="2ba", max_duration="4ba", callbacks=[StartAnother()]).fit()
    assert len(refused) == 1 and isinstance(refused[0], FolderLockedError)
    assert f"(pid {os.getpid()} on host" in str(refused[0])
    # Once the first has finished, the folder is free again.
    trainer(tmp_path, interval="2ba", max_duration="6ba", autoresume=True).fit()
    assert (tmp_path / "latest").read_text() == "ep0-ba6\n"


def test_the_lock_of_a_killed_run_is_taken_over_with_a_warning(tmp_path):
    pids = []

    def crashing_run():
        trainer(tmp_path, interval="2ba", callbacks=[KillAt(3)]).fit()

    assert in_child(crashing_run) == -9
    holder = json.loads((tmp_path / LOCK).read_text())
    pids.append(holder["pid"])
    with pytest.warns(
        UserWarning, match=rf"took over the lock of run .*pid {pids[0]} .*process {pids[0]} is dead"
    ):
        trainer(tmp_path, interval="2ba", max_duration="4ba", autoresume=True).fit()
    assert (tmp_path / "latest").read_text() == "ep0-ba4\n"


def _foreign_lock(folder, expires_in):
    now = time.time()
    holder = {
        "owner": "elsewhere-run",
        "run_id": "f00d",
        "host": "another-host",
        "boot": "other-boot",
        "pid": 4242,
        "process": "",
        "token": "feedfacefeedface",
        "acquired": now - 600,
        "expires": now + expires_in,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK).write_text(json.dumps(holder))


def test_a_lease_from_another_machine_holds_until_it_expires(tmp_path):
    _foreign_lock(tmp_path, expires_in=3600)
    with pytest.raises(Exception) as refused:
        trainer(tmp_path, max_duration="2ba").fit()
    assert "held by run 'elsewhere-run' (pid 4242 on host another-host" in str(
        _cause(refused.value)
    )
    assert not list_checkpoints(tmp_path)  # nothing was written

    _foreign_lock(tmp_path, expires_in=-5)
    with pytest.warns(
        UserWarning, match=r"took over .*another-host.*: its lease expired \d+ s ago"
    ):
        trainer(tmp_path, max_duration="2ba").fit()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ep0-ba2"]


def test_lock_wait_waits_for_the_holder_to_let_go(tmp_path):
    storage = LocalStorage(tmp_path)
    first = FolderLock(storage, owner="first", run_id="1", lease=60)
    first.acquire()
    second = FolderLock(storage, owner="second", run_id="2", lease=60)
    with pytest.raises(FolderLockedError, match="held by run 'first'"):
        second.acquire()
    threading.Timer(0.3, first.release).start()
    assert second.acquire(wait=30) is None and second.held
    second.release()


def test_a_run_that_lost_its_folder_saves_nothing_more(tmp_path):
    class Usurp(Callback):
        def batch_end(self, state, logger):
            if state.timestamp.batch == 3:
                _foreign_lock(tmp_path, expires_in=3600)  # another run took it over

    with pytest.raises(Exception) as lost:
        trainer(tmp_path, interval="2ba", max_duration="6ba", callbacks=[Usurp()]).fit()
    assert "lost its hold on the checkpoint folder" in str(_cause(lost.value))
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ep0-ba2"]
    assert "elsewhere-run" in (tmp_path / LOCK).read_text()  # the new holder's lock stays


def test_lock_with_conditional_writes_on_remote_storage(remote):
    # S3 (If-None-Match / If-Match), fsspec's local file system (flock) and memory:// (a lock
    # of this process) all let a write depend on what was read.
    storage = open_storage(f"{remote.url}/run", remote.options)
    assert isinstance(storage, ConditionalStorage)
    first = FolderLock(storage, owner="first", run_id="1", lease=60)
    second = FolderLock(storage, owner="second", run_id="2", lease=60)
    first.acquire()
    with pytest.raises(
        FolderLockedError,
        match=rf"{re.escape(remote.url)}/run/\.trainkit-lock: .*held by run 'first'",
    ):
        second.acquire()

    # Two runs that both found the folder free: the conditional write lets one through.
    first.release()
    free, version = storage.read_versioned(LOCK)
    assert free == b""
    assert storage.write_if(LOCK, b'{"x": 1}', version) is True
    assert storage.write_if(LOCK, b'{"x": 2}', version) is False  # changed since it was read
    assert storage.read_bytes(LOCK) == b'{"x": 1}'
    _, changed = storage.read_versioned(LOCK)
    assert storage.delete_if(LOCK, version or "stale") is False
    assert storage.delete_if(LOCK, changed) is True and not storage.exists(LOCK)


def test_a_run_on_remote_storage_refuses_while_another_holds_it(remote, tmp_path):
    url = f"{remote.url}/run"
    holder = FolderLock(open_storage(url, remote.options), owner="other", run_id="9", lease=60)
    holder.acquire()
    try:
        with pytest.raises(Exception) as refused:
            trainer(
                url, max_duration="2ba", storage_options=remote.options, local_dir=tmp_path
            ).fit()
        assert "held by run 'other'" in str(_cause(refused.value))
    finally:
        holder.release()
    run = trainer(url, max_duration="2ba", storage_options=remote.options, local_dir=tmp_path)
    run.fit()
    loaded = trainer()
    load_checkpoint(
        loaded.state, f"{url}/latest", storage_options=remote.options, local_dir=tmp_path
    )
    assert torch.equal(flat_params(loaded.state.model), flat_params(run.state.model))


def test_a_lock_file_deleted_while_waiting_for_it_is_not_written_to(tmp_path):
    storage = LocalStorage(tmp_path)
    assert storage.write_if(LOCK, b"first", None)
    results = []
    with storage._locked_file(LOCK, create=False) as (_, path):
        waiter = threading.Thread(
            target=lambda: results.append(storage.write_if(LOCK, b"next", None))
        )
        waiter.start()
        time.sleep(0.2)  # the waiter opens the file and waits for its flock
        path.unlink()  # as a release does, under the flock
    waiter.join(30)
    assert results == [True]
    assert (tmp_path / LOCK).read_bytes() == b"next"  # not written into the deleted file


def _two_ranks(rank, world, folder):
    from ckpt_runs import sharded_trainer
    from trainkit.checkpoint import Checkpointer

    run = sharded_trainer(world, callbacks=[Checkpointer(folder=folder, interval="1ba")])
    try:
        run.fit()
    except Exception as err:
        return f"{type(_cause(err)).__name__}: {_cause(err)}"
    return "ok"


def test_two_ranks_hold_the_folder_through_rank_0_and_refuse_together(tmp_path):
    from multirank import run_ranks

    assert run_ranks(_two_ranks, 2, str(tmp_path / "a")) == ["ok", "ok"]
    assert [p.name for p in list_checkpoints(tmp_path / "a")] == ["ep0-ba3", "ep0-ba2", "ep0-ba1"]
    assert not (tmp_path / "a" / LOCK).exists()

    _foreign_lock(tmp_path / "b", expires_in=3600)
    results = run_ranks(_two_ranks, 2, str(tmp_path / "b"))
    assert all(r.startswith("FolderLockedError") and "elsewhere-run" in r for r in results), results
    assert not list_checkpoints(tmp_path / "b")


class RaiseAt(Callback):
    """Raises ``error`` at batch ``batch``'s BATCH_CHECKPOINT (after the Checkpointer's)."""

    def __init__(self, batch, error):
        self.batch, self.error = batch, error

    def batch_checkpoint(self, state, logger):
        if state.timestamp.batch == self.batch:
            raise self.error


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()], ids=repr)
def test_a_run_that_raises_mid_fit_lets_go_of_its_folder_at_once(tmp_path, error):
    failing = trainer(tmp_path, interval="2ba", max_duration="6ba", callbacks=[RaiseAt(3, error)])
    with pytest.raises(type(error)):
        failing.fit()  # not closed: FIT_ABORTED alone must free the folder
    assert not (tmp_path / LOCK).exists() or (tmp_path / LOCK).read_text() == ""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no stale-lock take-over, no waiting
        second = trainer(tmp_path, interval="2ba", max_duration="6ba", autoresume=True)
        assert second.state.timestamp.batch == 2
        second.fit()
    assert (tmp_path / "latest").read_text() == "ep0-ba6\n"


def test_a_run_that_raises_while_an_async_save_is_in_flight_publishes_it(tmp_path):
    failing = trainer(
        tmp_path,
        interval="2ba",
        max_duration="6ba",
        async_save=True,
        callbacks=[RaiseAt(2, RuntimeError("boom"))],  # right after the save of batch 2 began
    )
    with pytest.raises(RuntimeError, match="boom"):
        failing.fit()
    assert (tmp_path / "latest").read_text() == "ep0-ba2\n"
    second = trainer(tmp_path, interval="2ba", max_duration="6ba", autoresume=True)
    assert second.state.timestamp.batch == 2
