"""``upload_to_loggers``: each published checkpoint is given to the run's logger destinations
as ``checkpoints/<name>`` (by rank 0, after publication, an asynchronous one when it is
awaited), never a save that was abandoned; a URL folder is refused."""

import json
import warnings
from pathlib import Path

import pytest
import torch

from ckpt_runs import abandon_while_writing, sharded_trainer, trainer
from multirank import run_ranks
from trainkit.checkpoint import Checkpointer, CheckpointerConfig, list_checkpoints
from trainkit.core import LoggerDestination


class Recorder(LoggerDestination):
    """Keeps each file given to it (the default `upload_folder` gives them one by one), with
    its bytes at that moment, and which checkpoints were published when it was given one."""

    def __init__(self, folder=None):
        self.folder = folder
        self.files: dict[str, bytes] = {}
        self.published_then: list[tuple[str, list[str]]] = []

    def upload_folder(self, name, path, overwrite=False):
        if self.folder is not None:
            published = sorted(p.name for p in list_checkpoints(self.folder))
            self.published_then.append((name, published))
        super().upload_folder(name, path, overwrite)

    def upload_file(self, name, path, overwrite=False):
        self.files[name] = Path(path).read_bytes()

    def checkpoints(self) -> list[str]:
        return sorted({name.split("/")[1] for name in self.files})


def _on_disk(folder: Path) -> dict[str, bytes]:
    return {
        f"checkpoints/{folder.name}/{p.relative_to(folder).as_posix()}": p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file()
    }


@pytest.mark.parametrize("async_save", [False, True])
def test_each_published_checkpoint_is_given_with_exactly_its_files(tmp_path, async_save):
    recorder = Recorder(tmp_path)
    run = trainer(
        tmp_path,
        loggers=[recorder],
        max_duration="6ba",
        interval="2ba",
        async_save=async_save,
        upload_to_loggers=True,
    )
    run.fit()
    run.close()
    saved = sorted(list_checkpoints(tmp_path))
    assert [p.name for p in saved] == ["ep0-ba2", "ep0-ba4", "ep0-ba6"]
    assert recorder.checkpoints() == ["ep0-ba2", "ep0-ba4", "ep0-ba6"]
    expected = {}
    for folder in saved:
        manifest = json.loads((folder / "trainkit-manifest.json").read_text())
        given = {n for n in recorder.files if n.startswith(f"checkpoints/{folder.name}/")}
        prefix = f"checkpoints/{folder.name}/"
        assert given == {prefix + f for f in [*manifest["files"], "trainkit-manifest.json"]}
        expected.update(_on_disk(folder))
    assert recorder.files == expected  # the same bytes, nothing else
    # Given after publication: each was already listed as a complete checkpoint.
    assert recorder.published_then == [
        ("checkpoints/ep0-ba2", ["ep0-ba2"]),
        ("checkpoints/ep0-ba4", ["ep0-ba2", "ep0-ba4"]),
        ("checkpoints/ep0-ba6", ["ep0-ba2", "ep0-ba4", "ep0-ba6"]),
    ]


def test_rotation_comes_after_the_upload(tmp_path):
    recorder = Recorder(tmp_path)
    options = {"max_duration": "6ba", "interval": "2ba", "keep": 1, "upload_to_loggers": True}
    run = trainer(tmp_path, loggers=[recorder], **options)
    run.fit()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ep0-ba6"]
    assert recorder.checkpoints() == ["ep0-ba2", "ep0-ba4", "ep0-ba6"]
    # Each was given before the one before it was rotated away.
    assert recorder.published_then == [
        ("checkpoints/ep0-ba2", ["ep0-ba2"]),
        ("checkpoints/ep0-ba4", ["ep0-ba2", "ep0-ba4"]),
        ("checkpoints/ep0-ba6", ["ep0-ba4", "ep0-ba6"]),
    ]


def test_without_the_option_nothing_is_given(tmp_path):
    recorder = Recorder()
    trainer(tmp_path, loggers=[recorder], max_duration="2ba", interval="1ba").fit()
    assert recorder.files == {}


@pytest.mark.parametrize("async_save", [False, True])
def test_an_abandoned_save_is_never_given(tmp_path, monkeypatch, async_save):
    checkpointer = Checkpointer(
        folder=tmp_path, interval="2ba", async_save=async_save, upload_to_loggers=True
    )
    abandon_while_writing(monkeypatch, checkpointer)
    recorder = Recorder()
    run = trainer(max_duration="4ba", callbacks=[checkpointer], loggers=[recorder])
    with pytest.raises(Exception, match=r"ep0-ba4.* was abandoned \(preempted\)"):
        run.fit()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ep0-ba2"]
    assert recorder.checkpoints() == ["ep0-ba2"]
    assert recorder.files == _on_disk(tmp_path / "ep0-ba2")


def test_a_save_outside_a_run_warns_that_no_logger_got_it(tmp_path):
    run = trainer(max_duration="1ba")
    run.fit()
    checkpointer = Checkpointer(folder=tmp_path, upload_to_loggers=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checkpointer.save(run.state)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ep0-ba1"]
    assert any("was not given to any logger destination" in str(w.message) for w in caught)


def test_a_url_folder_or_no_folder_is_refused():
    with pytest.raises(
        ValueError,
        match=r"needs a local folder, and folder 's3://bucket/ckpts' is a URL: its checkpoints "
        r"are already remote.*Give a local path",
    ):
        CheckpointerConfig(folder="s3://bucket/ckpts", upload_to_loggers=True)
    with pytest.raises(ValueError, match=r"folder is None \(load only\); give a local folder"):
        Checkpointer(folder=None, load_path="ckpt", upload_to_loggers=True)
    assert CheckpointerConfig(folder="s3://bucket/ckpts").upload_to_loggers is False


def _two_ranks(rank, world, folder):
    recorder = Recorder()
    checkpointer = Checkpointer(folder=folder, interval="2ba", upload_to_loggers=True)
    run = sharded_trainer(world, callbacks=[checkpointer], max_duration="2ba", loggers=[recorder])
    run.fit()
    run.close()
    return recorder.files


def test_only_rank_zero_gives_the_checkpoint_with_every_ranks_shards(tmp_path):
    torch.set_num_threads(1)
    rank0, rank1 = run_ranks(_two_ranks, 2, tmp_path)
    assert rank1 == {}
    assert rank0 == _on_disk(tmp_path / "ep0-ba2")
    assert {"checkpoints/ep0-ba2/__0_0.distcp", "checkpoints/ep0-ba2/__1_0.distcp"} <= set(rank0)
