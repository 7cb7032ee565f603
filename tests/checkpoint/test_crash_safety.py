"""A crash at any moment of a save leaves the previous checkpoint usable."""

import os
import signal
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemWriter

from ckpt_runs import in_child, takes_over_the_dead_run, trainer
from toy import flat_params
from trainkit.checkpoint import (
    CheckpointError,
    _commit,
    _storage,
    _write,
    list_checkpoints,
    load_checkpoint,
)

# Points inside a save where the process dies; each one is patched to SIGKILL itself.
KILL_POINTS = {
    "while writing shards": (FileSystemWriter, "write_data"),
    "while hashing shards": (_write, "hasher"),  # files are hashed as they are written
    "before the manifest": (_storage, "atomic_write_bytes"),
    "before publishing the folder": (os, "rename"),
    "before updating latest": (_commit, "fsync_dir"),
}


def _die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


def _second_save_dies(folder: Path, owner, name: str) -> None:
    run = trainer(folder, interval="4ba", max_duration=None)
    run.fit(duration="4ba")  # the first checkpoint, saved normally
    setattr(owner, name, _die)
    run.fit(duration="4ba")  # dies inside the second save


@pytest.mark.parametrize("point", sorted(KILL_POINTS))
def test_kill_during_save_leaves_the_previous_checkpoint(tmp_path, point):
    owner, name = KILL_POINTS[point]
    assert in_child(_second_save_dies, tmp_path, owner, name) == -9

    assert (tmp_path / "latest").read_text().strip() in {"ep0-ba4", "ep1-ba8"}
    complete = [p.name for p in list_checkpoints(tmp_path)]
    assert "ep0-ba4" in complete

    resumed = trainer(tmp_path, interval="4ba", max_duration="8ba", autoresume=True)
    assert resumed.state.timestamp.batch in {4, 8}
    # The next save clears what the interrupted one left behind.
    with takes_over_the_dead_run():
        resumed.fit(duration="4ba")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_incomplete_folder_is_not_a_checkpoint(tmp_path):
    trainer(tmp_path, max_duration="2ba").fit()
    broken = tmp_path / "ep9-ba99"
    broken.mkdir()
    (broken / ".metadata").write_bytes(b"partial")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ep0-ba2"]
    with pytest.raises(
        CheckpointError, match=r"is not a checkpoint: it has no trainkit-manifest\.json"
    ):
        load_checkpoint(trainer().state, broken)


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupted_shard_is_detected_and_autoresume_falls_back(tmp_path):
    trainer(tmp_path, interval="2ba", max_duration="4ba").fit()
    newest = tmp_path / "ep0-ba4"
    _corrupt(newest / "__0_0.distcp")
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp does not match its xxh3_128"):
        load_checkpoint(trainer().state, newest)
    with pytest.warns(
        UserWarning, match=r"cannot resume from .*ep0-ba4.*trying the previous checkpoint"
    ):
        resumed = trainer(tmp_path, autoresume=True)
    assert resumed.state.timestamp.batch == 2


def test_truncated_shard_is_detected(tmp_path):
    trainer(tmp_path, max_duration="2ba").fit()
    shard = tmp_path / "ep0-ba2" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(
        CheckpointError, match=r"__0_0\.distcp has 100 bytes, the manifest says \d+: truncated"
    ):
        load_checkpoint(trainer().state, tmp_path / "ep0-ba2", verify=False)


def test_resume_from_the_previous_checkpoint_is_still_exact(tmp_path):
    trainer(tmp_path, interval="2ba", max_duration="6ba").fit()
    _corrupt(tmp_path / "ep0-ba6" / "__0_0.distcp")
    with pytest.warns(UserWarning, match="trying the previous checkpoint"):
        resumed = trainer(tmp_path, interval="2ba", max_duration="6ba", autoresume=True)
    resumed.fit()
    reference = trainer(max_duration="6ba")
    reference.fit()
    assert torch.equal(flat_params(resumed.state.model), flat_params(reference.state.model))
