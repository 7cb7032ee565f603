"""The storage test suite for storages reached by URL: S3 (a moto server on 127.0.0.1) and
`FsspecStorage` on fsspec's in-memory and local file systems (fixtures `remote` and
`shared_remote` in conftest.py). The Checkpointer's tests (interval, rotation, kill -9 and
resume) run on these and on local folders in test_checkpointer.py; local folders have
their own crash-safety and confinement tests."""

import os
import re
import signal

import pytest
import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from ckpt_runs import in_child, takes_over_the_dead_run, trainer
from multirank import run_ranks
from toy import flat_params
from trainkit.checkpoint import (
    CheckpointError,
    _commit,
    inspect_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from trainkit.core import Callback


@pytest.fixture(autouse=True)
def one_thread():
    # Forked children run single-threaded; the parent matches them for bitwise comparisons.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _corrupt(remote, key):
    data = bytearray(remote.read(key))
    data[len(data) // 2] ^= 0xFF
    remote.write(key, bytes(data))


def test_save_and_load_round_trip_is_bitwise(remote, tmp_path):
    run = trainer(max_duration="5ba")
    run.fit()
    url = f"{remote.url}/runs/ckpt"
    scratch = tmp_path / "scratch"
    published = save_checkpoint(run.state, url, storage_options=remote.options, local_dir=scratch)
    assert published.wait() == url
    assert remote.objects() == [
        "runs/ckpt/.metadata",
        "runs/ckpt/__0_0.distcp",
        "runs/ckpt/trainkit-manifest.json",
        "runs/latest",
    ]
    assert list(scratch.iterdir()) == []  # the local staging copy is gone

    for path in (url, f"{remote.url}/runs", f"{remote.url}/runs/latest"):
        fresh = trainer()
        manifest = load_checkpoint(
            fresh.state, path, storage_options=remote.options, local_dir=scratch
        )
        assert manifest.timestamp["batch"] == 5
        assert fresh.state.timestamp == run.state.timestamp
        assert torch.equal(flat_params(fresh.state.model), flat_params(run.state.model))
        before = run.state.optimizers[0].state_dict()["state"]
        after = fresh.state.optimizers[0].state_dict()["state"]
        for index, values in before.items():
            assert torch.equal(values["exp_avg"], after[index]["exp_avg"])
    assert list(scratch.iterdir()) == []  # downloads are removed after loading

    assert list_checkpoints(f"{remote.url}/runs", storage_options=remote.options) == [url]
    assert verify_checkpoint(url, storage_options=remote.options).timestamp["batch"] == 5
    info = inspect_checkpoint(f"{remote.url}/runs", storage_options=remote.options)
    assert info["path"] == url and info["model"]["module.0.weight"]["shape"] == [16, 8]


class CrashAt(Callback):
    """Fails the run at the end of batch ``batch`` (after the checkpoint, as `KillAt`)."""

    def __init__(self, batch):
        self.batch = batch

    def batch_checkpoint(self, state, logger):
        if state.timestamp.batch == self.batch:
            raise RuntimeError("crash")


def test_autoresume_in_one_process_is_bitwise_equal(remote, tmp_path):
    # What the kill -9 test checks on storages other processes see, for all of them
    # (memory:// too): a run that fails after batch 14, resumed from the storage alone.
    url = f"{remote.url}/run"
    options = dict(interval="4ba", autoresume=True, storage_options=remote.options,
                   local_dir=tmp_path)  # fmt: skip
    failed = trainer(url, callbacks=[CrashAt(14)], **options)
    with pytest.raises(RuntimeError, match="crash"):
        failed.fit()
    failed.close()  # gives the folder back
    names = [
        str(p).rsplit("/", 1)[1] for p in list_checkpoints(url, storage_options=remote.options)
    ]
    assert names == ["ep1-ba12", "ep0-ba8", "ep0-ba4"]

    resumed = trainer(url, **options)
    assert resumed.state.timestamp.batch == 12
    resumed.fit()
    reference = trainer()
    reference.fit()
    assert torch.equal(flat_params(resumed.state.model), flat_params(reference.state.model))
    assert remote.read("run/latest") == b"ep3-ba24\n"


def test_corrupted_remote_shard_is_detected_and_autoresume_falls_back(remote, tmp_path):
    url = f"{remote.url}/run"
    trainer(url, interval="2ba", max_duration="4ba", storage_options=remote.options).fit()
    _corrupt(remote, "run/ep0-ba4/__0_0.distcp")
    with pytest.raises(
        CheckpointError,
        match=rf"{re.escape(url)}/ep0-ba4/__0_0\.distcp does not match its xxh3_128",
    ):
        load_checkpoint(trainer().state, f"{url}/ep0-ba4", storage_options=remote.options)
    with pytest.warns(
        UserWarning, match=rf"cannot resume from {re.escape(url)}/ep0-ba4 .*trying the previous"
    ):
        resumed = trainer(url, autoresume=True, storage_options=remote.options, local_dir=tmp_path)
    assert resumed.state.timestamp.batch == 2
    assert list(tmp_path.iterdir()) == []


def _die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


class _DieOnLatest:
    """A storage that dies when ``latest`` is written: after the checkpoint is published."""

    def __init__(self, storage):
        self.storage = storage

    def __getattr__(self, name):
        return getattr(self.storage, name)

    def write_bytes(self, key, data):
        if key == "latest":
            _die()
        self.storage.write_bytes(key, data)


def _publish_then_die(self, files, metadata):
    self.storage = _DieOnLatest(self.storage)
    _PUBLISH(self, files, metadata)


_PUBLISH = _commit.Commit.publish
KILL_POINTS = {  # as test_crash_safety.py's, for a storage that cannot rename
    "while writing shards": (FileSystemWriter, "write_data", _die),
    "while uploading shards": (_commit.Commit, "hand_over", _die),
    "before the manifest": (_commit.Manifest, "to_json", _die),
    "before updating latest": (_commit.Commit, "publish", _publish_then_die),
}


def _second_save_dies(url, options, scratch, point):
    run = trainer(url, interval="4ba", max_duration=None, storage_options=options,
                  local_dir=scratch)  # fmt: skip
    run.fit(duration="4ba")  # the first checkpoint, saved normally
    owner, name, replacement = KILL_POINTS[point]
    setattr(owner, name, replacement)
    run.fit(duration="4ba")  # dies inside the second save


@pytest.mark.parametrize("point", sorted(KILL_POINTS))
def test_kill_during_save_leaves_the_previous_checkpoint(shared_remote, tmp_path, point):
    remote, url = shared_remote, f"{shared_remote.url}/run"
    assert in_child(_second_save_dies, url, remote.options, tmp_path, point) == -9

    assert remote.read("run/latest") == b"ep0-ba4\n"
    names = [
        str(p).rsplit("/", 1)[1] for p in list_checkpoints(url, storage_options=remote.options)
    ]
    assert names == (["ep1-ba8", "ep0-ba4"] if point == "before updating latest" else ["ep0-ba4"])

    resumed = trainer(url, interval="4ba", max_duration="12ba", autoresume=True,
                      storage_options=remote.options, local_dir=tmp_path)  # fmt: skip
    assert resumed.state.timestamp.batch == 4  # what latest names, when it is complete
    with takes_over_the_dead_run():
        resumed.fit()
    reference = trainer(max_duration="12ba")
    reference.fit()
    assert torch.equal(flat_params(resumed.state.model), flat_params(reference.state.model))
    # The next save cleared what the interrupted one left behind.
    assert not [key for key in remote.objects() if key.endswith(".incomplete")]
    # The killed run's second save ended its fit (batch 8, after the epoch: ep1-ba8); killed
    # before updating latest, it is complete but was never the latest, and the resumed run
    # leaves it (it saves batch 8 mid-run, as ep0-ba8).
    left = {"ep1-ba8"} if point == "before updating latest" else set()
    assert {key.split("/")[1] for key in remote.objects("run/") if key.count("/") == 2} == {
        "ep0-ba4",
        "ep0-ba8",
        "ep1-ba12",
    } | left


def _full_model(state):
    # Gathered on rank 0 only (the other ranks get empty dicts).
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(state.model, options=options)


def _save_sharded(rank, world, url, options, make, scratch):
    run = make(world)
    run.fit()
    save_checkpoint(run.state, url, storage_options=options, local_dir=scratch)
    return _full_model(run.state)


def _load_sharded(rank, world, url, options, make, scratch):
    run = make(world)
    load_checkpoint(run.state, url, storage_options=options, local_dir=scratch)
    return _full_model(run.state), run.state.timestamp.batch


def _assert_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_two_ranks_save_sharded_then_load_on_two_and_on_one(
    shared_remote, tmp_path, sharded_trainer
):
    remote = shared_remote
    url, scratch = f"{remote.url}/run/ckpt", tmp_path / "scratch"
    saved = run_ranks(_save_sharded, 2, url, remote.options, sharded_trainer, scratch)[0]
    shards = [key for key in remote.objects() if key.endswith(".distcp")]
    assert shards == [
        "run/ckpt/__0_0.distcp",
        "run/ckpt/__1_0.distcp",
    ]  # each rank uploaded its own

    (loaded, batch), (_, other_batch) = run_ranks(
        _load_sharded, 2, url, remote.options, sharded_trainer, scratch
    )
    _assert_equal(loaded, saved)
    assert batch == other_batch == 3

    single = sharded_trainer(1, sharded=False)
    with pytest.warns(UserWarning, match="saved run had 2 ranks"):
        load_checkpoint(single.state, url, storage_options=remote.options, local_dir=scratch)
    _assert_equal(get_model_state_dict(single.state.model), saved)
    assert list(scratch.iterdir()) == []
