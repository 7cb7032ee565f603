"""A run refuses a checkpoint folder whose checkpoints are another model's (issue 52.1); the
Trainer says where it resumed, or that the run is complete; warnings name the user's line."""

import json

import pytest

import ckpt_runs
from ckpt_runs import trainer
from toy import blobs, loader, mlp
from trainkit.checkpoint import (
    Checkpointer,
    CheckpointError,
    FolderOfAnotherModelError,
    list_checkpoints,
)
from trainkit.core import CallbackError
from trainkit.trainer import Trainer


def test_a_run_of_another_model_refuses_the_folder_before_touching_it(tmp_path):
    folder = tmp_path / "checkpoints"
    trainer(str(folder), interval="1ep", autoresume=True, max_duration="2ep").fit()
    before = {p.name: p.stat().st_mtime_ns for p in folder.rglob("*")}
    latest = (folder / "latest").read_text()

    with pytest.raises(CallbackError) as caught:
        trainer(str(folder), interval="1ep", autoresume=True, model=mlp(hidden=8))
    assert isinstance(caught.value.__cause__, FolderOfAnotherModelError)
    message = str(caught.value.__cause__)
    assert str(folder) in message and "another model" in message
    assert "saved by run 'run-" in message  # the run that saved them, by name
    assert "178 values in 4 tensors" in message and "90 values" in message
    assert "overwrite=True" in message and "run_name" in message  # what to do instead
    # Nothing was read into the run or written there: latest still names the old run's.
    assert {p.name: p.stat().st_mtime_ns for p in folder.rglob("*")} == before
    assert (folder / "latest").read_text() == latest


def test_a_folder_none_of_whose_checkpoints_loads_is_refused_not_trained_over(tmp_path):
    # Checkpoints saved before manifests recorded the model (as the runs/default):
    # each fails to load into another model, and the run used to start afresh there.
    folder = tmp_path / "checkpoints"
    trainer(str(folder), interval="1ep", autoresume=True, max_duration="2ep").fit()
    for path in folder.glob("*/trainkit-manifest.json"):
        manifest = json.loads(path.read_text())
        del manifest["model"]
        path.write_text(json.dumps(manifest))
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}

    with pytest.raises(CallbackError) as caught, pytest.warns(UserWarning, match="ep2-ba16"):
        trainer(str(folder), interval="1ep", autoresume=True, model=mlp(hidden=8))
    assert isinstance(caught.value.__cause__, CheckpointError)
    message = str(caught.value.__cause__)
    assert f"{folder} holds 2 checkpoint(s) and none can be loaded into this run" in message
    assert "does not fit this model" in message or "Size mismatch" in message
    assert "overwrite=True" in message and "--run-dir" in message
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before


def test_the_same_model_resumes_and_overwrite_lets_another_one_train_there(tmp_path):
    folder = tmp_path / "checkpoints"
    trainer(str(folder), interval="1ep", autoresume=True, max_duration="2ep").fit()
    manifest = json.loads((folder / "ep2-ba16" / "trainkit-manifest.json").read_text())
    assert (
        manifest["model"]["tensors"] == 4
        and manifest["model"]["values"] == 8 * 16 + 16 + 16 * 2 + 2
    )

    resumed = trainer(str(folder), interval="1ep", autoresume=True, max_duration="3ep")
    assert resumed.state.timestamp.batch == 16

    with pytest.warns(UserWarning, match="cannot resume from"):
        other = trainer(
            str(folder), interval="1ep", autoresume=True, overwrite=True, model=mlp(hidden=8)
        )
    assert other.state.timestamp.batch == 0  # nothing of the other model loaded
    other.fit()
    assert len(list_checkpoints(str(folder))) >= 1


def test_a_warning_points_at_the_users_line_not_the_engine(tmp_path):
    folder = tmp_path / "checkpoints"
    trainer(str(folder), interval="1ep", autoresume=True, max_duration="1ep").fit()
    with pytest.warns(UserWarning, match="cannot resume from") as caught:
        trainer(str(folder), autoresume=True, overwrite=True, model=mlp(hidden=8))
    # The line that built the Trainer (the shared factory's), not .../trainkit/core/_engine.py.
    assert {w.filename for w in caught} == {ckpt_runs.__file__}


# --- the Trainer says where a run resumed, or that it is complete (issue 52.8) ----------------


def evaluated(folder, max_duration):
    model = mlp(dropout=0.0)
    return Trainer(
        model=model,
        train_dataloader=loader(blobs(64)),
        eval_dataloader=loader(blobs(32, seed=1), shuffle=False),
        max_duration=max_duration,
        callbacks=[Checkpointer(folder=str(folder), interval="1ep", autoresume=True)],
        progress_bar=False,
        device="cpu",
        seed=3,
    )


def test_the_trainer_says_once_where_it_resumes(tmp_path, capsys):
    folder = tmp_path / "checkpoints"
    evaluated(folder, "1ep").fit()
    assert "resuming" not in capsys.readouterr().out  # a fresh run says nothing of it

    evaluated(folder, "2ep").fit()
    out = capsys.readouterr().out
    assert out.count("resuming from") == 1
    assert f"resuming from {folder / 'ep1-ba4'} at batch 4" in out


def test_a_run_resumed_complete_says_so_and_fit_gives_its_results(tmp_path, capsys):
    folder = tmp_path / "checkpoints"
    first = evaluated(folder, "2ep")
    first.fit()
    capsys.readouterr()

    again = evaluated(folder, "1ep")  # a script run again, with a shorter duration
    again.fit()
    out = capsys.readouterr().out
    assert "resuming" not in out
    assert out.count("run already complete") == 1
    assert f"run already complete at batch 8: max_duration is 1ep (resumed from {folder}" in out
    assert again.state.timestamp.batch == 8  # not trained on
    assert again.last_eval.keys() == first.last_eval.keys() and again.last_eval
    for key, value in again.last_eval.items():
        assert float(value) == pytest.approx(float(first.last_eval[key]))  # not NaN
