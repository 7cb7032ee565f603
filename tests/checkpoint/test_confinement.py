"""Nothing outside a checkpoint folder is read, and nothing outside a run folder deleted.

Each escape is built as an attacker who can write the run folder would build it, with the
manifest rewritten to match (so only the confinement stands in the way): the file outside
holds another run's weights, so a load that followed it would succeed with wrong weights.
"""

import json
import os
import pickle
import signal
import stat

import pytest
import torch

from ckpt_runs import trainer
from multirank import fork_context
from toy import flat_params, mlp
from trainkit.checkpoint import (
    CheckpointError,
    UnsafePathError,
    export_checkpoint,
    inspect_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from trainkit.checkpoint._cli import main as checkpoint_cli
from trainkit.checkpoint._manifest import hash_file
from trainkit.checkpoint._safe import safe_load_metadata

SHARD = "__0_0.distcp"


def _saved(folder, seed):
    run = trainer(model=mlp(seed=seed), max_duration="2ba")
    run.fit()
    save_checkpoint(run.state, folder).wait()
    return run


def _rewrite_manifest_entry(folder, name, size=None, checksum=None):
    """What an attacker who controls the folder does: make the manifest match ``name``."""
    manifest_path = folder / "trainkit-manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][name] = {
        "size": (folder / name).stat().st_size if size is None else size,
        "sha256": hash_file(folder / name) if checksum is None else checksum,  # follows links
    }
    manifest_path.write_text(json.dumps(manifest))


def _point_metadata_at(folder, path):
    """Rewrite ``.metadata`` so that every entry is read from ``path``."""
    metadata = safe_load_metadata((folder / ".metadata").read_bytes(), "test")
    for info in metadata.storage_data.values():
        info.relative_path = path
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    _rewrite_manifest_entry(folder, ".metadata")


def _within(seconds, fn, *args):
    """Run ``fn(*args)`` in a forked process: ("returned", its value) or (error type,
    message). A child still running after ``seconds`` (blocked on a FIFO) is killed and the
    test fails."""
    ctx = fork_context()
    receiver, sender = ctx.Pipe(duplex=False)

    def target():
        torch.set_num_threads(1)
        try:
            outcome = ("returned", fn(*args))
        except BaseException as err:  # reported to the parent
            outcome = (type(err).__name__, str(err))
        sender.send(outcome)

    proc = ctx.Process(target=target)
    proc.start()
    sender.close()
    finished = receiver.poll(seconds)
    if not finished:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        raise AssertionError(f"still running after {seconds} s: blocked reading a FIFO?")
    outcome = receiver.recv()
    proc.join()
    return outcome


def test_a_symlinked_shard_is_refused_by_load_verify_export_and_autoresume(tmp_path):
    run_folder = tmp_path / "run"
    good = trainer(run_folder, interval="2ba", max_duration="4ba")
    good.fit()
    _saved(tmp_path / "elsewhere", seed=1)  # another run's weights, outside the folder
    newest = run_folder / "ep0-ba4"
    (newest / SHARD).unlink()
    (newest / SHARD).symlink_to(tmp_path / "elsewhere" / SHARD)
    _rewrite_manifest_entry(newest, SHARD)

    fresh = trainer()
    before = flat_params(fresh.state.model)
    message = rf"{newest / SHARD} is a symbolic link, not a regular file .* not followed"
    with pytest.raises(UnsafePathError, match=message):
        load_checkpoint(fresh.state, newest)
    assert torch.equal(flat_params(fresh.state.model), before)  # nothing was loaded
    with pytest.raises(UnsafePathError, match=message):
        verify_checkpoint(newest)
    with pytest.raises(UnsafePathError, match=message):
        export_checkpoint(newest, tmp_path / "weights.safetensors")
    assert not (tmp_path / "weights.safetensors").exists()

    # Autoresume skips the tampered checkpoint and resumes from the one before it.
    with pytest.warns(UserWarning, match=r"cannot resume from .*ep0-ba4 .*symbolic link"):
        resumed = trainer(run_folder, autoresume=True)
    assert resumed.state.timestamp.batch == 2


def test_a_symlinked_metadata_file_is_refused_by_inspect(tmp_path):
    _saved(tmp_path / "ckpt", seed=0)
    _saved(tmp_path / "elsewhere", seed=1)
    (tmp_path / "ckpt" / ".metadata").unlink()
    (tmp_path / "ckpt" / ".metadata").symlink_to(tmp_path / "elsewhere" / ".metadata")
    _rewrite_manifest_entry(tmp_path / "ckpt", ".metadata")
    with pytest.raises(UnsafePathError, match=r"\.metadata is a symbolic link"):
        inspect_checkpoint(tmp_path / "ckpt")


@pytest.mark.parametrize("kind", ["absolute", "dotdot"])
def test_storage_paths_outside_the_folder_in_metadata_are_refused(tmp_path, kind, capsys):
    folder = tmp_path / "run" / "ckpt"
    _saved(folder, seed=0)
    _saved(tmp_path / "run" / "outside", seed=1)
    path = (
        str(tmp_path / "run" / "outside" / SHARD) if kind == "absolute" else f"../outside/{SHARD}"
    )
    _point_metadata_at(folder, path)

    fresh = trainer()
    before = flat_params(fresh.state.model)
    message = rf"\.metadata \(a storage path\) names '{path}', which is not a plain file name"
    with pytest.raises(UnsafePathError, match=message):
        load_checkpoint(fresh.state, folder)
    assert torch.equal(flat_params(fresh.state.model), before)
    for tool in (inspect_checkpoint, verify_checkpoint):
        with pytest.raises(UnsafePathError, match=message):
            tool(folder)
    assert checkpoint_cli(["export", str(folder), str(tmp_path / "w.safetensors")]) == 1
    assert f"names '{path}'" in capsys.readouterr().err
    assert not (tmp_path / "w.safetensors").exists()


def test_metadata_naming_a_file_the_manifest_does_not_list_is_refused(tmp_path):
    folder = tmp_path / "ckpt"
    _saved(folder, seed=0)
    (folder / "extra.bin").write_bytes((folder / SHARD).read_bytes())  # never checked
    _point_metadata_at(folder, "extra.bin")
    with pytest.raises(
        CheckpointError, match=r"names the file 'extra\.bin', which the .* manifest"
    ):
        load_checkpoint(trainer().state, folder)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    folder = tmp_path / "ckpt"
    _saved(folder, seed=0)
    os.mkfifo(folder / "pipe")  # opening it for reading would wait for a writer forever
    _point_metadata_at(folder, "pipe")
    _rewrite_manifest_entry(folder, "pipe", size=0, checksum="0" * 64)
    assert stat.S_ISFIFO(os.lstat(folder / "pipe").st_mode)

    fifo = r"ckpt/pipe is a FIFO, not a regular file"
    out = tmp_path / "w.safetensors"
    for call in (
        lambda: export_checkpoint(folder, out),
        lambda: verify_checkpoint(folder),
        lambda: load_checkpoint(trainer().state, folder, verify=False),
    ):
        kind, message = _within(20, call)
        assert kind == "UnsafePathError" and fifo in message, (kind, message)
    assert _within(20, lambda: checkpoint_cli(["export", str(folder), str(out)])) == ("returned", 1)
    assert not out.exists()

    # The same for .metadata itself (read by inspect without the shards).
    (folder / ".metadata").unlink()
    os.mkfifo(folder / ".metadata")
    kind, message = _within(20, lambda: inspect_checkpoint(folder))
    assert kind == "UnsafePathError" and "ckpt/.metadata is a FIFO" in message


def _files(folder):
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_rotation_never_follows_a_symlinked_checkpoint_folder(tmp_path):
    outside = tmp_path / "outside"
    _saved(outside / "ckpt", seed=1)
    kept_outside = _files(outside)
    run_folder = tmp_path / "run"
    run_folder.mkdir()
    # Looks like the oldest checkpoint of the run: rotation with keep=1 would delete it.
    (run_folder / "ep0-ba1").symlink_to(outside / "ckpt", target_is_directory=True)
    # A real checkpoint of another run in the same folder: not this run's to delete.
    _saved(run_folder / "imported", seed=2)
    imported = _files(run_folder / "imported")

    trainer(run_folder, interval="2ba", keep=1, max_duration="6ba").fit()

    assert _files(outside) == kept_outside  # nothing outside was deleted or changed
    assert (run_folder / "ep0-ba1").is_symlink()  # the link itself is not the run's either
    assert _files(run_folder / "imported") == imported
    names = sorted(p.name for p in list_checkpoints(run_folder))
    assert names == ["ep0-ba6", "imported"]  # links are never listed as checkpoints


def test_rotation_deletes_only_files_the_manifest_lists(tmp_path):
    run_folder = tmp_path / "run"
    trainer(run_folder, interval="1ba", keep=1, max_duration="1ba").fit()
    notes = run_folder / "ep0-ba1" / "notes.txt"
    notes.write_text("mine")
    with pytest.warns(UserWarning, match=r"ep0-ba1: kept \['notes\.txt'\], which the run did not"):
        trainer(run_folder, interval="1ba", keep=1, max_duration="3ba", autoresume=True).fit()
    assert notes.read_text() == "mine"
    assert sorted(p.name for p in (run_folder / "ep0-ba1").iterdir()) == ["notes.txt"]
    assert [p.name for p in list_checkpoints(run_folder)] == ["ep0-ba3"]


def test_a_resumed_run_rotates_the_checkpoints_it_wrote_before(tmp_path):
    trainer(tmp_path, interval="2ba", keep=2, max_duration="6ba").fit()
    trainer(tmp_path, interval="2ba", keep=2, max_duration="10ba", autoresume=True).fit()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ep1-ba10", "ep0-ba8"]


def test_a_symlinked_latest_is_not_followed(tmp_path):
    trainer(tmp_path / "run", interval="2ba", max_duration="4ba").fit()
    (tmp_path / "decoy").write_text("ep0-ba2\n")
    (tmp_path / "run" / "latest").unlink()
    (tmp_path / "run" / "latest").symlink_to(tmp_path / "decoy")
    with pytest.raises(UnsafePathError, match=r"run/latest is a symbolic link"):
        load_checkpoint(trainer().state, tmp_path / "run" / "latest")
    with pytest.warns(UserWarning, match=r"ignoring .*latest"):
        resumed = trainer(tmp_path / "run", autoresume=True)
    assert resumed.state.timestamp.batch == 4  # by training time, not by the link


class RecordingClient:
    """A boto3 client that records the key (or prefix) of every request it sends."""

    def __init__(self, client):
        self.client, self.keys = client, []

    def __getattr__(self, name):
        method = getattr(self.client, name)
        if name == "get_paginator":
            return lambda op: _RecordingPaginator(method(op), self.keys)
        if not callable(method):
            return method

        def call(*args, **kwargs):
            self.keys += [kwargs[k] for k in ("Key", "Prefix") if k in kwargs]
            self.keys += [o["Key"] for o in kwargs.get("Delete", {}).get("Objects", ())]
            return method(*args, **kwargs)

        return call


class _RecordingPaginator:
    def __init__(self, paginator, keys):
        self.paginator, self.keys = paginator, keys

    def paginate(self, **kwargs):
        self.keys.append(kwargs.get("Prefix", ""))
        return self.paginator.paginate(**kwargs)


def test_s3_keys_outside_the_prefix_are_never_requested(s3, tmp_path):
    from trainkit.checkpoint import S3Storage

    # A checkpoint of another run outside the prefix, and keys that reach it through "..".
    _saved_run = trainer(max_duration="2ba")
    _saved_run.fit()
    save_checkpoint(_saved_run.state, f"{s3.url}/victim/ckpt", storage_options=s3.options)
    manifest = s3.client.get_object(Bucket=s3.bucket, Key="victim/ckpt/trainkit-manifest.json")
    s3.client.put_object(
        Bucket=s3.bucket,
        Key="run/../victim/ckpt/trainkit-manifest.json",
        Body=manifest["Body"].read(),
    )
    s3.client.put_object(Bucket=s3.bucket, Key="run/latest", Body=b"../victim/ckpt\n")
    victim = {key for key in s3.objects() if not key.startswith("run/")}

    recorder = RecordingClient(s3.client)
    options = {"client": recorder}
    url = f"{s3.url}/run"
    with pytest.raises(CheckpointError, match=r"holds '\.\./victim/ckpt', not the name of"):
        load_checkpoint(trainer().state, f"{url}/latest", storage_options=options)
    run = trainer(url, interval="1ba", keep=1, max_duration="3ba", autoresume=True,
                  storage_options=options, local_dir=tmp_path)  # fmt: skip
    assert run.state.timestamp.batch == 0  # nothing of ours to resume from, and not the victim
    run.fit()
    assert list_checkpoints(url, storage_options=options) == [f"{url}/ep0-ba3"]
    assert inspect_checkpoint(url, storage_options=options)["timestamp"]["batch"] == 3

    storage = S3Storage(url, client=recorder)
    before = len(recorder.keys)
    for key in ("../victim/ckpt/trainkit-manifest.json", "a//b", "./x", "a/../../victim"):
        with pytest.raises(UnsafePathError, match="not a plain file name"):
            storage.read_bytes(key)
    assert len(recorder.keys) == before  # refused before any request
    with pytest.raises(UnsafePathError):
        S3Storage(f"{s3.url}/run/../victim", client=recorder)

    assert recorder.keys, "the recorder saw the requests"
    for key in recorder.keys:
        assert key.startswith("run/") and ".." not in key.split("/"), key
    assert victim <= set(s3.objects())  # nothing outside the prefix was deleted


def test_local_storage_never_goes_through_a_link(tmp_path):
    from trainkit.checkpoint import LocalStorage

    outside = tmp_path / "outside"
    (outside / "ckpt").mkdir(parents=True)
    (outside / "ckpt" / "trainkit-manifest.json").write_text("{}")
    root = tmp_path / "run"
    root.mkdir()
    (root / "ckpt").symlink_to(outside / "ckpt", target_is_directory=True)
    storage = LocalStorage(root)
    for call in (
        lambda: storage.read_bytes("ckpt/trainkit-manifest.json"),
        lambda: storage.write_bytes("ckpt/latest", b"x"),
        lambda: storage.delete("ckpt/trainkit-manifest.json"),
        lambda: storage.exists("ckpt/trainkit-manifest.json"),
    ):
        with pytest.raises(UnsafePathError, match=r"run/ckpt is a symbolic link"):
            call()
    assert storage.list_folders() == []
    storage.delete("ckpt")  # removes the link, never what it points at
    assert not (root / "ckpt").exists()
    assert sorted(p.name for p in (outside / "ckpt").iterdir()) == ["trainkit-manifest.json"]
