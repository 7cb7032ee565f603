"""save_checkpoint / load_checkpoint: what is restored, strictness, ignore_keys, bad paths."""

import pytest
import torch
from torch import nn

from ckpt_runs import trainer
from toy import flat_params, mlp
from trainkit.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from trainkit.trainer import Classifier


@pytest.fixture
def saved(tmp_path):
    run = trainer(max_duration="5ba")
    run.fit()
    save_checkpoint(run.state, tmp_path / "ckpt")
    return run, tmp_path / "ckpt"


def test_round_trip_restores_the_whole_state(saved):
    run, path = saved
    fresh = trainer()
    manifest = load_checkpoint(fresh.state, path)
    assert manifest.timestamp["batch"] == 5
    assert fresh.state.timestamp == run.state.timestamp
    assert torch.equal(flat_params(fresh.state.model), flat_params(run.state.model))
    before, after = run.state.optimizers[0].state_dict(), fresh.state.optimizers[0].state_dict()
    for index, values in before["state"].items():
        assert torch.equal(values["exp_avg"], after["state"][index]["exp_avg"])


def test_different_model_is_refused_with_the_names(saved):
    _, path = saved
    wider = Classifier(
        nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(), nn.Linear(16, 2), nn.Linear(2, 2))
    )
    with pytest.raises(
        CheckpointError,
        match=r"missing from the checkpoint \['module\.4\.bias', 'module\.4\.weight'\]",
    ):
        load_checkpoint(trainer(model=wider).state, path)
    with pytest.warns(UserWarning, match="left as they are"):
        run = trainer(model=wider)
        head = wider.module[4].weight.detach().clone()
        load_checkpoint(run.state, path, strict=False)
    assert torch.equal(wider.module[4].weight, head)
    assert torch.equal(wider.module[0].weight, saved[0].state.model.module[0].weight)


def test_ignore_keys_keeps_the_models_own_values(saved):
    run, path = saved
    fresh_model = mlp(seed=5)
    own_head = fresh_model.module[3].weight.detach().clone()
    fresh = trainer(model=fresh_model)
    load_checkpoint(fresh.state, path, ignore_keys=["model/module.3.*"])
    assert torch.equal(fresh_model.module[3].weight, own_head)
    assert torch.equal(fresh_model.module[0].weight, run.state.model.module[0].weight)


def test_ignore_rng_keeps_this_runs_generators(saved):
    _, path = saved
    fresh = trainer()
    torch.manual_seed(123)
    expected = torch.rand(2)
    torch.manual_seed(123)
    load_checkpoint(fresh.state, path, ignore_keys=["rng"])
    assert torch.equal(torch.rand(2), expected)


def test_weights_only_checkpoint_needs_weights_only(tmp_path):
    run = trainer(max_duration="2ba")
    run.fit()
    save_checkpoint(run.state, tmp_path / "w", weights_only=True)
    with pytest.raises(
        CheckpointError, match="holds model weights only; load it with weights_only=True"
    ):
        load_checkpoint(trainer().state, tmp_path / "w")
    fresh = trainer()
    load_checkpoint(fresh.state, tmp_path / "w", weights_only=True)
    assert torch.equal(flat_params(fresh.state.model), flat_params(run.state.model))


def test_bad_paths(tmp_path):
    with pytest.raises(CheckpointError, match=r"checkpoint path .*nowhere does not exist"):
        load_checkpoint(trainer().state, tmp_path / "nowhere")
    (tmp_path / "plain").mkdir()
    with pytest.raises(
        CheckpointError,
        match=r"plain is not a checkpoint: it has no trainkit-manifest.json and no latest",
    ):
        load_checkpoint(trainer().state, tmp_path / "plain")
