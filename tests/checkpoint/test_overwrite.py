"""Saving onto a taken name: refused before anything is written, or replaced atomically."""

import os
import shutil
import signal

import pytest
import torch
from torch.distributed.checkpoint import FileSystemWriter

from ckpt_runs import in_child, trainer
from toy import flat_params
from trainkit.checkpoint import (
    CheckpointExistsError,
    _commit,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from trainkit.core import CallbackError


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _batch(path):
    fresh = trainer()
    load_checkpoint(fresh.state, path)
    return fresh.state.timestamp.batch


def test_a_taken_name_is_refused_before_anything_is_written(tmp_path):
    run = trainer(max_duration=None)
    run.fit(duration="2ba")
    save_checkpoint(run.state, tmp_path / "ckpt")
    before = _files(tmp_path)
    run.fit(duration="2ba")
    with pytest.raises(CheckpointExistsError) as caught:
        save_checkpoint(run.state, tmp_path / "ckpt")
    message = str(caught.value)
    assert "ckpt already holds a checkpoint of run" in message and "(saved at batch 2)" in message
    assert "nothing was written" in message and "overwrite=True" in message
    assert _files(tmp_path) == before  # no shard, no hidden folder, latest untouched

    save_checkpoint(run.state, tmp_path / "ckpt", overwrite=True)
    assert _batch(tmp_path / "ckpt") == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "latest"]


def test_a_folder_that_is_not_a_checkpoint_is_not_replaced_either(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointExistsError, match="a folder that is not a checkpoint"):
        save_checkpoint(trainer().state, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "notes.txt").read_text() == "mine"


def _die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


# Moments of an overwriting save at which the process dies, and which version the name holds.
KILL_POINTS = {
    "while writing shards": ((FileSystemWriter, "write_data"), 2),
    "at the exchange": ((_commit, "_exchange"), 2),
    "before the old one is removed": ((shutil, "rmtree"), 4),
}


def _overwrite_dies(folder, owner, name):
    run = trainer(max_duration=None)
    run.fit(duration="2ba")
    save_checkpoint(run.state, folder / "ckpt")
    run.fit(duration="2ba")
    setattr(owner, name, _die)
    save_checkpoint(run.state, folder / "ckpt", overwrite=True)


@pytest.mark.parametrize("point", sorted(KILL_POINTS))
def test_overwrite_is_atomic(tmp_path, point):
    (owner, name), holds = KILL_POINTS[point]
    assert in_child(_overwrite_dies, tmp_path, owner, name) == -9
    # The name holds one complete checkpoint, the old or the new one, never neither.
    assert _batch(tmp_path / "ckpt") == holds
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt"]


def test_overwrite_without_an_atomic_exchange_still_replaces(tmp_path, monkeypatch):
    monkeypatch.setattr(_commit, "_exchange", lambda first, second: False)
    run = trainer(max_duration=None)
    run.fit(duration="2ba")
    save_checkpoint(run.state, tmp_path / "ckpt")
    run.fit(duration="1ba")
    save_checkpoint(run.state, tmp_path / "ckpt", overwrite=True)
    assert _batch(tmp_path / "ckpt") == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "latest"]


def test_a_new_run_into_a_folder_with_later_checkpoints_stops_at_fit_start(tmp_path):
    trainer(tmp_path, interval="2ba", max_duration="4ba").fit()
    before = _files(tmp_path)
    run = trainer(tmp_path, interval="2ba", max_duration="4ba")
    with pytest.raises(CallbackError, match="failed at event FIT_START") as caught:
        run.fit()
    assert isinstance(caught.value.__cause__, CheckpointExistsError)
    message = str(caught.value)
    assert "would save over: ep0-ba2 (batch 2), ep0-ba4 (batch 4)" in message
    assert "autoresume=True" in message and "overwrite=True" in message
    assert run.state.timestamp.batch == 0 and _files(tmp_path) == before

    # Other names do not collide; overwrite=True replaces.
    trainer(tmp_path, interval="2ba", max_duration="4ba", name_format="b{batch}").fit()
    replaced = trainer(tmp_path, interval="2ba", max_duration="4ba", overwrite=True)
    replaced.fit()
    assert _batch(tmp_path / "ep0-ba4") == 4
    assert (tmp_path / "latest").read_text().strip() == "ep0-ba4"


def test_two_saves_of_one_run_under_one_name_are_refused(tmp_path):
    run = trainer(tmp_path, interval="1ba", max_duration="3ba", name_format="only")
    with pytest.raises(CallbackError, match="only already holds a checkpoint") as caught:
        run.fit()
    assert isinstance(caught.value.__cause__, CheckpointExistsError)
    assert _batch(tmp_path / "only") == 1


def test_autoresume_replaces_the_progress_it_lost(tmp_path):
    trainer(tmp_path, interval="2ba", max_duration="4ba").fit()
    # As after a crash between publishing ep0-ba4 and naming it in latest.
    (tmp_path / "latest").write_text("ep0-ba2\n")
    resumed = trainer(tmp_path, interval="2ba", max_duration="6ba", autoresume=True)
    assert resumed.state.timestamp.batch == 2
    resumed.fit()  # saves ep0-ba4 again, over the lost one, without overwrite=True
    reference = trainer(max_duration="6ba")
    reference.fit()
    assert torch.equal(flat_params(resumed.state.model), flat_params(reference.state.model))
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ep0-ba6", "ep0-ba4", "ep0-ba2"]
