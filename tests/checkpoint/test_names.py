"""Checkpoint names: ``{rank}``, ``{run_name}`` and every `Timestamp` field; one folder per
checkpoint whatever the rank count."""

import pytest
import torch

from ckpt_runs import sharded_trainer, trainer
from multirank import run_ranks
from toy import blobs, flat_params, loader, mlp
from trainkit.checkpoint import Checkpointer, CheckpointerConfig, list_checkpoints
from trainkit.core import CallbackError, Timestamp
from trainkit.trainer import Trainer


def named_run(folder, run_name, **checkpointer):
    model = mlp()
    return Trainer(
        model=model,
        train_dataloader=loader(blobs(64)),
        max_duration="3ba",
        callbacks=[Checkpointer(folder=folder, **checkpointer)],
        run_name=run_name,
        progress_bar=False,
        device="cpu",
        seed=3,
    )


def test_every_timestamp_field_and_the_run_name(tmp_path):
    fields = Timestamp._fields
    template = "-".join(f"{{{f}}}" for f in fields if not f.endswith("_wct"))
    template += "-{total_wct:.0f}-{run_name}-r{rank}-w{world_size}"
    run = named_run(tmp_path, "exp7", name_format=template, interval="2ba")
    run.fit()
    t = run.state.timestamp  # the end of fit is saved too
    counts = [t.epoch, t.batch, t.sample, t.token, t.batch_in_epoch, t.sample_in_epoch]
    expected = "-".join(map(str, [*counts, t.token_in_epoch]))
    expected += f"-{t.total_wct:.0f}-exp7-r0-w1"
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names[0] == expected
    assert len(names) == 2 and names[1].startswith("0-2-32-0-2-32-0-")


def test_folder_takes_the_run_name(tmp_path):
    run = named_run(str(tmp_path / "{run_name}" / "ckpt"), "exp8")
    run.fit()
    assert (tmp_path / "exp8" / "ckpt" / "ep0-ba3" / "trainkit-manifest.json").is_file()
    assert run.state.callbacks[0].folder == tmp_path / "exp8" / "ckpt"


def test_load_path_fills_rank_with_zero(tmp_path):
    """As in the name of Composer's rank-0 file."""
    source = named_run(tmp_path / "a", "src", name_format="ep{epoch}-ba{batch}-rank{rank}")
    source.fit()
    resumed = named_run(tmp_path / "b", "dst", load_path=str(tmp_path / "a" / "ep0-ba3-rank{rank}"))
    assert resumed.state.timestamp.batch == 3
    assert torch.equal(flat_params(resumed.state.model), flat_params(source.state.model))


def test_composer_style_pt_name_makes_a_folder_without_the_suffix(tmp_path):
    trainer(tmp_path, name_format="ep{epoch}-ba{batch}-rank{rank}.pt", max_duration="2ba").fit()
    checkpoint = tmp_path / "ep0-ba2-rank0"
    assert checkpoint.is_dir() and (checkpoint / "trainkit-manifest.json").is_file()
    assert (tmp_path / "latest").read_text().strip() == "ep0-ba2-rank0"


@pytest.mark.parametrize(
    ("name_format", "message"),
    [
        (
            "ep{epochs}",
            r"is not valid: it has the field \{epochs\}.*accepts \{run_name\}, \{rank\}",
        ),
        ("ep{0}", r"it has the field \{0\}"),
        ("ep{epoch", r"'ep\{epoch' is not a valid template"),
        ("ep{epoch}.tar.gz", r"ends in '\.tar\.gz': trainkit writes each checkpoint as a folder"),
        ("ep{epoch}.pt.zst", r"ends in '\.pt\.zst'"),
        ("{run_name}/ep{epoch}", r"cannot be the name of a checkpoint folder"),
        (".ep{epoch}", r"gives '\.ep0'.*not start with '\.'"),
        ("latest", r"not be 'latest'"),
        ("t{total_wct:d}", r"is not valid \(Unknown format code 'd'"),
    ],
)
def test_bad_name_formats_are_refused(tmp_path, name_format, message):
    with pytest.raises(ValueError, match=message):
        CheckpointerConfig(folder=str(tmp_path), name_format=name_format)


def test_a_run_name_that_cannot_name_a_folder_fails_before_training(tmp_path):
    with pytest.raises(CallbackError, match=r"gives 'a/b-0'.*run_name 'a/b'"):
        named_run(tmp_path, "a/b", name_format="{run_name}-{batch}")
    with pytest.raises(ValueError, match=r"folder 'x/\{run\}' is not valid: it has the field"):
        CheckpointerConfig(folder="x/{run}")


def _save_on_ranks(rank, world, folder):
    # Wall-clock seconds differ between ranks; the folder they write must not.
    name_format = "ba{batch}-t{batch_wct}-rank{rank}"
    checkpointer = Checkpointer(folder=folder, interval="1ba", name_format=name_format)
    run = sharded_trainer(world, callbacks=[checkpointer], max_duration="2ba", run_name="shared")
    run.fit()
    return run.state.timestamp.batch


def test_rank_never_makes_ranks_write_different_folders(tmp_path):
    assert run_ranks(_save_on_ranks, 2, tmp_path) == [2, 2]
    folders = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert len(folders) == 2
    for name, batch in zip(folders, (1, 2), strict=True):
        assert name.startswith(f"ba{batch}-t") and name.endswith("-rank0")
        shards = sorted(p.name for p in (tmp_path / name).glob("*.distcp"))
        assert shards == ["__0_0.distcp", "__1_0.distcp"]  # both ranks' shards, one folder
