"""Save and load options: weights-only saves, exclude_algorithms, ignore_keys callables."""

import json

import pytest
import torch

from ckpt_runs import trainer
from toy import blobs, flat_params, loader, mlp
from trainkit.checkpoint import (
    Checkpointer,
    CheckpointerConfig,
    inspect_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from trainkit.core import Algorithm, CallbackError
from trainkit.trainer import Trainer


def test_save_weights_only_saves_the_model_and_nothing_else(tmp_path):
    source = trainer(tmp_path, save_weights_only=True, max_duration="3ba")
    source.fit()
    manifest = json.loads((tmp_path / "ep0-ba3" / "trainkit-manifest.json").read_text())
    assert manifest["weights_only"] is True
    assert inspect_checkpoint(tmp_path / "ep0-ba3")["keys"] == ["model"]
    with pytest.raises(CallbackError, match="holds model weights only; load it with weights_only"):
        trainer(tmp_path / "b", load_path=str(tmp_path / "ep0-ba3"))
    finetune = trainer(tmp_path / "c", load_path=str(tmp_path / "ep0-ba3"), load_weights_only=True)
    assert torch.equal(flat_params(finetune.state.model), flat_params(source.state.model))
    assert finetune.state.timestamp.batch == 0


def test_save_weights_only_cannot_autoresume(tmp_path):
    with pytest.raises(
        CallbackError, match="autoresume=True needs full checkpoints, but save_weights_only"
    ):
        trainer(tmp_path, save_weights_only=True, autoresume=True)


def test_the_old_weights_only_option_names_its_two_successors(tmp_path):
    with pytest.raises(TypeError, match=r"use load_weights_only=True .* or save_weights_only=True"):
        Checkpointer(folder=tmp_path, weights_only=True)


class Reshape(Algorithm):
    """Stands for surgery (required_on_load) that also keeps state."""

    required_on_load = True

    def __init__(self, value=0):
        super().__init__()
        self.value = value

    def match(self, event, state):
        return False

    def apply(self, event, state, logger):
        return None

    def state_dict(self):
        return {"value": torch.tensor(self.value)}

    def load_state_dict(self, state):
        self.value = int(state["value"])


def run(*algorithms, callbacks=()):
    model = mlp(seed=1)
    return Trainer(
        model=model,
        train_dataloader=loader(blobs(64)),
        max_duration="2ba",
        algorithms=list(algorithms),
        callbacks=list(callbacks),
        progress_bar=False,
        device="cpu",
        seed=5,
    )


def test_exclude_algorithms_skips_their_state_and_their_requirement(tmp_path):
    source = run(Reshape(value=7))
    source.fit()
    save_checkpoint(source.state, tmp_path / "ckpt")

    # Not required any more: a run without the algorithm loads the checkpoint.
    plain = run()
    load_checkpoint(plain.state, tmp_path / "ckpt", exclude_algorithms=["Reshape"])
    assert torch.equal(flat_params(plain.state.model), flat_params(source.state.model))
    # Its saved state is not loaded into a run that has it.
    kept = Reshape(value=3)
    with_it = run(kept)
    load_checkpoint(with_it.state, tmp_path / "ckpt", exclude_algorithms=["Reshape"])
    assert kept.value == 3
    restored = Reshape(value=3)
    load_checkpoint(run(restored).state, tmp_path / "ckpt")
    assert restored.value == 7
    # A name nobody has is reported, not silently ignored.
    with pytest.warns(UserWarning, match=r"exclude_algorithms names \['Reshap'\], which neither"):
        load_checkpoint(run(Reshape()).state, tmp_path / "ckpt", exclude_algorithms=["Reshap"])


def test_exclude_algorithms_from_the_checkpointer(tmp_path):
    run(Reshape(), callbacks=[Checkpointer(folder=tmp_path / "a")]).fit()
    latest = str(tmp_path / "a" / "latest")
    with pytest.raises(CallbackError, match="exclude_algorithms=\\['Reshape'\\]"):
        run(callbacks=[Checkpointer(folder=tmp_path / "b", load_path=latest)])
    loaded = run(
        callbacks=[
            Checkpointer(folder=tmp_path / "b", load_path=latest, exclude_algorithms=["Reshape"])
        ]
    )
    assert loaded.state.timestamp.batch == 2


def test_ignore_keys_callable_edits_the_loaded_state(tmp_path):
    source = trainer(max_duration="3ba")
    source.fit()
    save_checkpoint(source.state, tmp_path / "ckpt")
    seen = {}

    def edit(state_dict):
        seen["top"] = sorted(state_dict)
        seen["state"] = sorted(state_dict["state"])
        model = state_dict["state"]["model"]
        model["module.0.weight"] = model["module.0.weight"] * 2
        del model["module.3.weight"], model["module.3.bias"]
        del state_dict["state"]["timestamp"]

    own = mlp(dropout=0.2, seed=8)
    own_head = own.module[3].weight.detach().clone()
    fresh = trainer(model=own)
    load_checkpoint(fresh.state, tmp_path / "ckpt", ignore_keys=edit)
    assert seen["top"] == ["state"]
    assert {"model", "optimizers", "rng", "timestamp"} <= set(seen["state"])
    assert torch.equal(own.module[0].weight, source.state.model.module[0].weight * 2)
    assert torch.equal(own.module[3].weight, own_head)  # deleted: the run's own value
    assert fresh.state.timestamp.batch == 0


def test_ignore_keys_apply_to_load_path_only_not_to_autoresume(tmp_path):
    source = trainer(tmp_path / "pre", max_duration="3ba")
    source.fit()
    options = {"interval": "2ba", "load_path": str(tmp_path / "pre" / "latest")}
    finetune = trainer(
        tmp_path / "ft", autoresume=True, ignore_keys=["model/module.3.*"], **options
    )
    head = finetune.state.model.module[3].weight.detach().clone()
    assert not torch.equal(head, source.state.model.module[3].weight)  # ignored from load_path
    finetune.fit(duration="2ba")
    resumed = trainer(tmp_path / "ft", autoresume=True, ignore_keys=["model/module.3.*"], **options)
    # Resuming restores the run's own (trained) head: ignore_keys was for load_path.
    assert torch.equal(flat_params(resumed.state.model), flat_params(finetune.state.model))


def test_bad_option_types(tmp_path):
    with pytest.raises(TypeError, match="ignore_keys must be a list of patterns, got int 3"):
        CheckpointerConfig(folder=str(tmp_path), ignore_keys=3)
    with pytest.raises(
        TypeError, match="exclude_algorithms must be a list of algorithm class names"
    ):
        CheckpointerConfig(folder=str(tmp_path), exclude_algorithms="BlurPool")


def test_without_a_folder_the_checkpointer_only_loads(tmp_path):
    source = trainer(max_duration="3ba")
    source.fit()
    save_checkpoint(source.state, tmp_path / "ckpt")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    run = trainer(callbacks=[Checkpointer(folder=None, load_path=str(tmp_path / "ckpt"))])
    assert run.state.timestamp.batch == 3
    run.fit(duration="2ba")
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing saved anywhere
    for options in ({"autoresume": True}, {"load_path": "latest"}):
        with pytest.raises(ValueError, match="looks for checkpoints in folder, and folder is None"):
            CheckpointerConfig(folder=None, **options)
