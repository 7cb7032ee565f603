"""Loading a checkpoint never executes code from it."""

import json
import os
import pickle

import pytest

from ckpt_runs import trainer
from trainkit.checkpoint import UnsafeCheckpointError, load_checkpoint, save_checkpoint
from trainkit.checkpoint._manifest import hash_file
from trainkit.core import Callback


class CreatesFile:
    """Unpickling this runs os.system: the classic pickle payload."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def _rewrite_manifest_entry(folder, name):
    manifest_path = folder / "trainkit-manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][name] = {
        "size": (folder / name).stat().st_size,
        "sha256": hash_file(folder / name),
    }
    manifest_path.write_text(json.dumps(manifest))


def test_pickle_payload_in_metadata_is_refused(tmp_path):
    run = trainer(tmp_path, max_duration="2ba")
    run.fit()
    folder, marker = tmp_path / "ep0-ba2", tmp_path / "pwned"
    (folder / ".metadata").write_bytes(pickle.dumps(CreatesFile(marker)))
    _rewrite_manifest_entry(folder, ".metadata")  # the attacker controls the manifest too
    with pytest.raises(
        UnsafeCheckpointError, match=r"asks to load posix\.system, which is not checkpoint metadata"
    ):
        load_checkpoint(trainer().state, folder)
    assert not marker.exists()


def test_pickle_payload_in_a_state_entry_is_refused(tmp_path):
    marker = tmp_path / "pwned"

    class Smuggler(Callback):
        def state_dict(self):
            return {"evil": CreatesFile(marker)}

    run = trainer(callbacks=[Smuggler()], max_duration="1ba")
    run.fit()
    save_checkpoint(run.state, tmp_path / "ckpt")
    with pytest.raises(
        UnsafeCheckpointError,
        match=r"entry 'state\.callbacks\..*Smuggler\.evil' holds a Python object .*GLOBAL posix\.system",
    ):
        load_checkpoint(trainer(callbacks=[Smuggler()]).state, tmp_path / "ckpt")
    assert not marker.exists()


def test_metadata_that_is_not_metadata_is_refused(tmp_path):
    run = trainer(max_duration="1ba")
    run.fit()
    save_checkpoint(run.state, tmp_path / "ckpt")
    (tmp_path / "ckpt" / ".metadata").write_bytes(pickle.dumps({"just": "a dict"}))
    _rewrite_manifest_entry(tmp_path / "ckpt", ".metadata")
    with pytest.raises(Exception, match="holds a dict, not checkpoint metadata"):
        load_checkpoint(trainer().state, tmp_path / "ckpt")
