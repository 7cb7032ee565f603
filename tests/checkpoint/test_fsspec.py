"""What only `FsspecStorage` does: which URLs reach it, the errors when a back end is
missing, confinement on fsspec's file systems, and its best-effort lock. The storage test
suite it shares with S3 is in test_remote_storage.py and test_folder_lock.py."""

import os
import sys
import threading
import uuid

import pytest
import torch

from ckpt_runs import trainer
from toy import flat_params
from trainkit.checkpoint import (
    CheckpointError,
    ConditionalStorage,
    FolderLock,
    FolderLockedError,
    LocalStorage,
    StorageError,
    UnsafePathError,
    open_storage,
)
from trainkit.checkpoint._fsspec import ConditionalFsspecStorage, FsspecStorage, fsspec_storage


@pytest.fixture
def memory_url():
    url = f"memory://t-{uuid.uuid4().hex[:12]}"
    yield url
    storage = fsspec_storage(url)
    if storage.fs.exists(storage.root):
        storage.fs.rm(storage.root, recursive=True)


def test_urls_reach_fsspec_by_scheme(tmp_path, memory_url):
    memory = open_storage(f"{memory_url}/run")
    assert type(memory) is ConditionalFsspecStorage and memory.root == f"/{memory_url[9:]}/run"
    assert memory.url == f"{memory_url}/run" and memory.local_path("x") is None
    # fsspec+<scheme> picks fsspec's file system over a native back end.
    local = open_storage(f"fsspec+file://{tmp_path}")
    assert type(local) is ConditionalFsspecStorage and local.root == str(tmp_path)
    assert isinstance(open_storage(f"file://{tmp_path}"), LocalStorage)
    # A scheme that no entry point names but fsspec knows.
    other = open_storage(f"local://{tmp_path}/other")
    assert isinstance(other, FsspecStorage) and other.root == f"{tmp_path}/other"
    other.write_bytes("a/b", b"x")
    assert (tmp_path / "other" / "a" / "b").read_bytes() == b"x"
    assert [p.name for p in (tmp_path / "other" / "a").iterdir()] == ["b"]  # no temp file left


def test_a_missing_back_end_names_the_package_to_install(monkeypatch):
    for url, package in (("gs://bucket/run", "gcsfs"), ("az://container/run", "adlfs")):
        if package in sys.modules:
            continue
        monkeypatch.setitem(sys.modules, package, None)  # not installed, even where it is
        with pytest.raises(
            CheckpointError,
            match=rf"{url[:2]}:// checkpoint storage \({url}\) needs fsspec's back end for it, "
            rf"{package}, which is not installed: pip install {package}",
        ):
            open_storage(url)
    with pytest.raises(CheckpointError, match=r"no storage back end for nope:// URLs"):
        open_storage("nope://x/y")

    monkeypatch.setitem(sys.modules, "fsspec", None)  # fsspec itself missing
    with pytest.raises(
        CheckpointError,
        match=r"gs:// checkpoint storage \(gs://bucket/run\) goes through fsspec, which is not "
        r'installed: pip install "trainkit-checkpoint\[fsspec\]"',
    ):
        open_storage("gs://bucket/run")
    with pytest.raises(CheckpointError, match=r'pip install "trainkit-checkpoint\[fsspec\]"'):
        open_storage("ftp://host/run")  # no entry point: fsspec's table is not there either


class RecordingFS:
    """An fsspec file system that records the path of every call it gets."""

    def __init__(self, fs):
        self.fs, self.paths = fs, []

    def __getattr__(self, name):
        method = getattr(self.fs, name)
        if not callable(method):
            return method

        def call(*args, **kwargs):
            self.paths += [a for a in args if isinstance(a, str)]
            return method(*args, **kwargs)

        return call


def test_keys_outside_the_root_are_never_requested(memory_url, monkeypatch):
    victim = fsspec_storage(f"{memory_url}/victim")
    victim.write_bytes("ckpt/trainkit-manifest.json", b"{}")
    storage = fsspec_storage(f"{memory_url}/run")
    storage.fs = recorder = RecordingFS(storage.fs)
    for key in ("../victim/ckpt/trainkit-manifest.json", "a//b", "./x", "a/../../victim", ""):
        for call in (storage.read_bytes, storage.exists, storage.delete):
            with pytest.raises((UnsafePathError, ValueError)):
                call(key)
        with pytest.raises(UnsafePathError, match="not a plain file name"):
            storage.write_bytes(key, b"x")
    assert recorder.paths == []  # refused before any request
    with pytest.raises(UnsafePathError, match=r"has a '\.\.' part"):
        fsspec_storage(f"{memory_url}/run/../victim")

    # A listing that returns paths outside the folder: nothing is deleted.
    storage.write_bytes("ckpt/a", b"1")
    real_find = recorder.fs.find
    with monkeypatch.context() as patch:
        outside = f"/{memory_url[9:]}/victim"
        patch.setattr(recorder.fs, "find", lambda path, **kw: [*real_find(path, **kw), outside])
        with pytest.raises(UnsafePathError, match=r"returned paths outside it"):
            storage.delete("ckpt")
    assert storage.read_bytes("ckpt/a") == b"1"
    assert victim.read_bytes("ckpt/trainkit-manifest.json") == b"{}"
    storage.delete("ckpt")
    assert storage.list_folders() == [] and victim.list_folders() == ["ckpt"]


def test_the_local_file_system_never_goes_through_a_link(tmp_path):
    outside = tmp_path / "outside"
    (outside / "ckpt").mkdir(parents=True)
    (outside / "ckpt" / "trainkit-manifest.json").write_text("{}")
    (outside / "secret").write_text("weights")
    root = tmp_path / "run"
    (root / "real").mkdir(parents=True)
    (root / "ckpt").symlink_to(outside / "ckpt", target_is_directory=True)
    (root / "real" / "link").symlink_to(outside / "secret")
    os.mkfifo(root / "real" / "pipe")
    storage = open_storage(f"fsspec+file://{root}")
    for call in (
        lambda: storage.read_bytes("ckpt/trainkit-manifest.json"),
        lambda: storage.write_bytes("ckpt/latest", b"x"),
        lambda: storage.delete("ckpt/trainkit-manifest.json"),
        lambda: storage.read_bytes("real/link"),
        lambda: storage.download("real/link", tmp_path / "copy"),
    ):
        with pytest.raises(UnsafePathError, match=r"is or goes through a symbolic link"):
            call()
    with pytest.raises(UnsafePathError, match=r"real/pipe is not a regular file"):
        storage.read_bytes("real/pipe")  # refused before it is opened: nothing blocks
    assert storage.list_folders() == ["real"]  # the linked folder is no checkpoint
    storage.delete("ckpt")  # removes the link, never what it points at
    storage.delete("real")
    assert not (root / "ckpt").exists() and not (root / "real").exists()
    assert (outside / "ckpt" / "trainkit-manifest.json").read_text() == "{}"
    assert (outside / "secret").read_text() == "weights"


def test_errors_name_the_url_but_never_the_credentials(memory_url, monkeypatch):
    storage = fsspec_storage(f"{memory_url}/run", token="s3cr3t-t0ken")

    def refuse(*args, **kwargs):
        raise PermissionError("403 for bearer s3cr3t-t0ken")

    monkeypatch.setattr(storage.fs, "cat_file", refuse)
    with pytest.raises(StorageError) as failed:
        storage.read_bytes("latest")
    assert (
        str(failed.value)
        == f"read of {memory_url}/run/latest failed: PermissionError: 403 for bearer ***"
    )
    with pytest.raises(FileNotFoundError, match=rf"{memory_url}/run/nothing does not exist"):
        fsspec_storage(f"{memory_url}/run").read_bytes("nothing")


def test_without_conditional_writes_the_lock_is_best_effort(memory_url):
    # A file system with no conditional writes (gs://, az://...): the lock is written, then
    # read back. It still refuses a second run, and names the holder.
    storage = FsspecStorage(f"{memory_url}/run")
    assert not isinstance(storage, ConditionalStorage)
    first = FolderLock(storage, owner="first", run_id="1", lease=60)
    first.acquire()
    second = FolderLock(storage, owner="second", run_id="2", lease=60)
    with pytest.raises(FolderLockedError, match=r"held by run 'first'"):
        second.acquire()
    first.renew()
    first.release()
    assert not storage.exists(".trainkit-lock")
    assert second.acquire() is None and second.held
    second.release()


def test_memory_lock_lets_one_of_many_threads_through(memory_url):
    storage = open_storage(f"{memory_url}/run")
    start, won = threading.Barrier(8), []

    def race(i):
        start.wait()
        if storage.write_if(".trainkit-lock", f"{i}".encode(), None):
            won.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(won) == 1 and storage.read_bytes(".trainkit-lock") == f"{won[0]}".encode()


def test_a_run_on_a_file_system_with_folders_and_no_conditional_writes(tmp_path):
    # fsspec's "dir" file system over the local one: folders must be made before writing
    # into them, and there is no conditional write (the lock is best-effort).
    options = {"path": str(tmp_path / "fs"), "target_protocol": "file"}
    storage = open_storage("dir://run", options)
    assert type(storage) is FsspecStorage and not isinstance(storage, ConditionalStorage)
    first = trainer("dir://run", interval="2ba", keep=2, max_duration="6ba",
                    storage_options=options, local_dir=tmp_path / "scratch")  # fmt: skip
    first.fit()
    assert sorted(os.listdir(tmp_path / "fs" / "run")) == ["ep0-ba4", "ep0-ba6", "latest"]
    more = trainer("dir://run", interval="2ba", keep=2, max_duration="10ba", autoresume=True,
                   storage_options=options, local_dir=tmp_path / "scratch")  # fmt: skip
    assert more.state.timestamp.batch == 6
    more.fit()
    reference = trainer(max_duration="10ba")
    reference.fit()
    assert torch.equal(flat_params(more.state.model), flat_params(reference.state.model))
    assert sorted(os.listdir(tmp_path / "fs" / "run")) == ["ep0-ba8", "ep1-ba10", "latest"]
