"""The Trainer's Composer-style save/load arguments build trainkit-checkpoint's Checkpointer
(found by entry point): saving at the interval, keeping the newest K, autoresume, loading
weights, the overwrite rule."""

import pytest
import torch

from toy import blobs, flat_params, loader, mlp
from trainkit.checkpoint import Checkpointer, list_checkpoints
from trainkit.trainer import Trainer


def make(tmp_path, **kwargs):
    model = mlp(dropout=0.0)
    kwargs.setdefault("max_duration", "6ba")
    return Trainer(
        model=model,
        train_dataloader=loader(blobs(64)),  # 4 batches an epoch
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        progress_bar=False,
        device="cpu",
        seed=3,
        run_name="composer-args",
        **kwargs,
    )


def names(folder):
    return sorted(p.name for p in list_checkpoints(folder))


def test_save_folder_interval_and_keep(tmp_path):
    trainer = make(
        tmp_path,
        save_folder=str(tmp_path / "{run_name}"),
        save_interval="2ba",
        save_num_checkpoints_to_keep=2,
    )
    (checkpointer,) = [c for c in trainer.state.callbacks if isinstance(c, Checkpointer)]
    assert checkpointer.config.interval == "2ba" and checkpointer.config.keep == 2
    trainer.fit()
    # ba4 ends epoch 0 and is saved at its BATCH_CHECKPOINT, before the epoch count moves.
    assert names(tmp_path / "composer-args") == ["ep0-ba4", "ep1-ba6"]


def test_autoresume_continues_from_the_newest_checkpoint_exactly(tmp_path):
    full = make(tmp_path)
    full.fit()
    first = make(tmp_path, save_folder=str(tmp_path / "run"), save_interval="2ba", autoresume=True)
    first.fit(duration="3ba")  # then the process "dies": checkpoints at ba2 and ba3
    resumed = make(
        tmp_path, save_folder=str(tmp_path / "run"), save_interval="2ba", autoresume=True
    )
    assert resumed.state.timestamp.batch == 3
    resumed.fit()
    assert torch.equal(flat_params(resumed.state.model), flat_params(full.state.model))


def test_load_path_weights_only_starts_a_new_run_from_the_weights(tmp_path):
    source = make(tmp_path, save_folder=str(tmp_path / "source"))
    source.fit()
    (latest,) = list_checkpoints(tmp_path / "source")[:1]
    target = make(
        tmp_path,
        save_folder=str(tmp_path / "target"),
        load_path=str(latest),
        load_weights_only=True,
    )
    assert target.state.timestamp.batch == 0  # a new run: only the weights came
    assert torch.equal(flat_params(target.state.model), flat_params(source.state.model))


def test_load_ignore_keys_callable_edits_the_loaded_state(tmp_path):
    source = make(tmp_path, save_folder=str(tmp_path / "source"))
    source.fit()
    seen = []

    def drop_timestamp(state_dict):
        # Composer's layout: the run's state under "state".
        seen.append(sorted(state_dict["state"]))
        del state_dict["state"]["timestamp"]

    target = make(
        tmp_path,
        save_folder=str(tmp_path / "target"),
        load_path=str(list_checkpoints(tmp_path / "source")[0]),
        load_ignore_keys=drop_timestamp,
    )
    assert seen and "model" in seen[0]
    assert target.state.timestamp.batch == 0
    assert torch.equal(flat_params(target.state.model), flat_params(source.state.model))


def test_saving_onto_an_existing_checkpoint_needs_save_overwrite(tmp_path):
    make(tmp_path, save_folder=str(tmp_path / "run")).fit()
    again = make(tmp_path, save_folder=str(tmp_path / "run"))
    with pytest.raises(Exception, match="overwrite"):
        again.fit()
    replaced = make(tmp_path, save_folder=str(tmp_path / "run"), save_overwrite=True)
    replaced.fit()
    assert names(tmp_path / "run") == ["ep1-ba4", "ep1-ba6"]


def test_bad_combinations_are_refused(tmp_path):
    with pytest.raises(ValueError, match="autoresume=True needs save_folder"):
        make(tmp_path, autoresume=True)
    with pytest.raises(ValueError, match="callbacks already has one"):
        make(
            tmp_path,
            save_folder=str(tmp_path / "a"),
            callbacks=[Checkpointer(folder=str(tmp_path / "b"))],
        )


def test_missing_trainkit_checkpoint_is_an_install_hint(tmp_path, monkeypatch):
    from trainkit.core import plugins

    available = plugins.available
    monkeypatch.setattr(
        plugins,
        "available",
        lambda group: [n for n in available(group) if n != "checkpointer"],
    )
    with pytest.raises(ImportError, match="pip install trainkit-checkpoint"):
        make(tmp_path, save_folder=str(tmp_path / "run"))
