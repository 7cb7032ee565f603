"""Checkpointer: interval, rotation, autoresume, and bitwise resume after kill -9."""

import json

import pytest
import torch

from ckpt_runs import KillAt, in_child, trainer
from toy import flat_params
from trainkit.checkpoint import Checkpointer, list_checkpoints


@pytest.fixture(autouse=True)
def one_thread():
    # Forked children run single-threaded (TESTING.md); the parent matches them so that
    # results can be compared bitwise.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def uninterrupted():
    run = trainer()
    run.fit()
    return flat_params(run.state.model)


@pytest.mark.parametrize("async_save", [False, True])
def test_resume_after_kill_9_is_bitwise_equal(tmp_path, async_save):
    def crashing_run():
        trainer(
            tmp_path, interval="4ba", autoresume=True, async_save=async_save, callbacks=[KillAt(14)]
        ).fit()

    assert in_child(crashing_run) == -9
    names = [p.name for p in list_checkpoints(tmp_path)]
    if async_save and names[0] != "ep1-ba12":
        # Killed while batch 12's write was still in the background: it was never
        # published, and the run resumes from the checkpoint before it.
        assert not (tmp_path / "ep1-ba12").exists()
        names.insert(0, "ep1-ba12")
    assert names == ["ep1-ba12", "ep0-ba8", "ep0-ba4"]

    resumed = trainer(tmp_path, interval="4ba", autoresume=True, async_save=async_save)
    assert resumed.state.timestamp.batch == (12 if (tmp_path / "ep1-ba12").exists() else 8)
    resumed.fit()
    assert torch.equal(flat_params(resumed.state.model), uninterrupted())
    assert (tmp_path / "latest").read_text().strip() == "ep3-ba24"


def test_autoresume_with_an_empty_folder_starts_fresh(tmp_path):
    run = trainer(tmp_path / "new", autoresume=True)
    assert run.state.timestamp.batch == 0
    run.fit()
    assert (tmp_path / "new" / "latest").is_file()


def test_interval_and_final_save_and_manifest(tmp_path):
    trainer(tmp_path, interval="1ep", max_duration="20ba").fit()
    names = sorted(p.name for p in list_checkpoints(tmp_path))
    assert names == ["ep1-ba8", "ep2-ba16", "ep2-ba20"]  # every epoch, and the end of fit
    manifest = json.loads((tmp_path / "ep2-ba20" / "trainkit-manifest.json").read_text())
    assert manifest["timestamp"]["batch"] == 20
    assert manifest["world_size"] == 1
    assert set(manifest["files"]) == {".metadata", "__0_0.distcp"}
    for name, entry in manifest["files"].items():
        assert (tmp_path / "ep2-ba20" / name).stat().st_size == entry["size"]
        assert len(entry["xxh3_128"]) == 32  # the default checksum, 128 bits


def test_keep_rotates_but_never_the_newest(tmp_path):
    trainer(tmp_path, interval="2ba", keep=2, max_duration="10ba").fit()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ep1-ba10", "ep0-ba8"]
    assert (tmp_path / "latest").read_text().strip() == "ep1-ba10"


def test_load_path_latest_and_weights_only(tmp_path):
    source = trainer(tmp_path, max_duration="5ba")
    source.fit()
    finetune = trainer(tmp_path, load_path="latest", load_weights_only=True)
    assert torch.equal(flat_params(finetune.state.model), flat_params(source.state.model))
    assert finetune.state.timestamp.batch == 0  # only the weights came along
    assert finetune.state.optimizers[0].state == {} or all(
        s["step"] == 1 for s in finetune.state.optimizers[0].state.values()
    )


def test_callable_interval(tmp_path):
    every_third = lambda state, event: state.timestamp.batch % 3 == 0  # noqa: E731
    trainer(tmp_path, interval=every_third, max_duration="7ba").fit()
    assert sorted(p.name for p in list_checkpoints(tmp_path)) == ["ep0-ba3", "ep0-ba6", "ep0-ba7"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keep": 0}, r"keep=0 is not valid; use a positive number of checkpoints, or -1"),
        ({"keep": -3}, r"keep=-3 is not valid"),
        ({"interval": "every epoch"}, r"interval 'every epoch' is not a duration; use .*'10ep'"),
        ({"interval": "0ba"}, r"interval '0ba' is zero"),
        ({"name_format": "ep{epochs}"}, r"name_format 'ep\{epochs\}' is not valid"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        Checkpointer(folder=tmp_path, **kwargs)
