"""``Algorithm.required_on_load``: recorded in the manifest, enforced when a run loads."""

import json

import pytest
import torch

from toy import blobs, flat_params, loader, mlp
from trainkit.checkpoint import (
    Checkpointer,
    CheckpointError,
    MissingAlgorithmError,
    inspect_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from trainkit.core import Algorithm, CallbackError
from trainkit.trainer import Trainer


class Reshape(Algorithm):
    """Stands for a method that changes the model's structure (surgery)."""

    required_on_load = True

    def match(self, event, state):
        return False

    def apply(self, event, state, logger):
        return None


class Harmless(Algorithm):
    """A method a checkpoint does not depend on."""

    def match(self, event, state):
        return False

    def apply(self, event, state, logger):
        return None


def run(*algorithms, callbacks=(), seed=0):
    model = mlp(seed=seed)
    return Trainer(
        model=model,
        train_dataloader=loader(blobs(64)),
        optimizers=torch.optim.AdamW(model.parameters(), lr=0.01),
        max_duration="4ba",
        algorithms=list(algorithms),
        callbacks=list(callbacks),
        progress_bar=False,
        device="cpu",
        seed=11,
    )


@pytest.fixture
def saved(tmp_path):
    source = run(Reshape(), Harmless(), Reshape())
    source.fit()
    save_checkpoint(source.state, tmp_path / "ckpt")
    return source, tmp_path / "ckpt"


def test_the_manifest_records_the_algorithms_a_load_needs(saved, tmp_path):
    _, path = saved
    manifest = json.loads((path / "trainkit-manifest.json").read_text())
    assert manifest["required_algorithms"] == ["Reshape"]  # once, and not Harmless
    assert manifest["version"] >= 2  # the version that added required_algorithms
    assert inspect_checkpoint(path)["required_algorithms"] == ["Reshape"]
    plain = run(Harmless())
    save_checkpoint(plain.state, tmp_path / "plain")
    assert inspect_checkpoint(tmp_path / "plain")["required_algorithms"] == []


def test_loading_without_the_algorithm_is_a_clear_error(saved):
    _, path = saved
    fresh = run(Harmless(), seed=1)
    before = flat_params(fresh.state.model)
    for weights_only in (False, True):
        with pytest.raises(MissingAlgorithmError) as caught:
            load_checkpoint(fresh.state, path, weights_only=weights_only)
        message = str(caught.value)
        assert "saved by a run with the algorithm Reshape" in message
        assert "required_on_load" in message
        assert "add it to the run (e.g. algorithms=[Reshape()])" in message
        assert isinstance(caught.value, CheckpointError)
    # Nothing was loaded.
    assert torch.equal(flat_params(fresh.state.model), before)
    assert fresh.state.timestamp.batch == 0


def test_loading_with_the_algorithm_works(saved):
    source, path = saved
    fresh = run(Reshape(), seed=1)
    load_checkpoint(fresh.state, path)
    assert torch.equal(flat_params(fresh.state.model), flat_params(source.state.model))
    assert fresh.state.timestamp.batch == 4


def test_strict_false_loads_anyway_with_a_warning(saved):
    source, path = saved
    fresh = run(seed=1)
    with pytest.warns(UserWarning, match=r"algorithm Reshape, .*loading anyway \(strict=False\)"):
        load_checkpoint(fresh.state, path, strict=False)
    assert torch.equal(flat_params(fresh.state.model), flat_params(source.state.model))


def test_checkpointer_refuses_and_never_falls_back_to_starting_fresh(tmp_path):
    folder = tmp_path / "run"
    run(Reshape(), callbacks=[Checkpointer(folder=folder, interval="2ba")]).fit()
    for options in ({"autoresume": True}, {"load_path": "latest"}):
        with pytest.raises(CallbackError, match="Checkpointer failed at event BEFORE_LOAD") as e:
            run(callbacks=[Checkpointer(folder=folder, **options)])
        assert isinstance(e.value.__cause__, MissingAlgorithmError)
        assert "algorithms=[Reshape()]" in str(e.value)
    resumed = run(Reshape(), callbacks=[Checkpointer(folder=folder, autoresume=True)])
    assert resumed.state.timestamp.batch == 4


def test_inspect_command_names_the_required_algorithms(saved, capsys):
    from trainkit.checkpoint._cli import main

    _, path = saved
    assert main(["inspect", str(path)]) == 0
    assert "requires     Reshape (algorithms a run must have to load it)" in capsys.readouterr().out
