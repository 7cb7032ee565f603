"""A checkpoint Composer saved (one ``.pt`` file) continues as a trainkit run, loaded safely.

The files are built here in Composer's layout, read from Composer's save code
(``composer/utils/checkpoint.py`` ``_save_checkpoint``, ``composer/core/state.py``
``State.state_dict``, ``composer/core/time.py`` ``Timestamp.state_dict``), without Composer:
``{"state": {"model", "optimizers": {class name: state}, "schedulers", "algorithms",
"callbacks", "scaler", "timestamp": {"Timestamp": ...}, "rank_zero_seed", "train_metrics",
"eval_metrics", "run_name", "dataset_state", "integrations", "metadata"}, "rng": [...]}``.
"""

from __future__ import annotations

import datetime
import os
import random
import warnings
import zipfile

import numpy as np
import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from ckpt_runs import sharded_trainer, trainer
from multirank import run_ranks
from toy import flat_params, mlp
from trainkit.checkpoint import (
    CheckpointError,
    MissingAlgorithmError,
    UnsafeCheckpointError,
    load_checkpoint,
    load_torch_file,
)
from trainkit.checkpoint import _composer as composer_module
from trainkit.core import Algorithm
from trainkit.trainer import HuggingFaceModel, Trainer


def composer_timestamp(state) -> dict:
    """What Composer's ``Timestamp.state_dict()`` holds: counts, and wall-clock timedeltas."""
    t = state.timestamp
    seconds = datetime.timedelta(seconds=t.total_wct)
    return {
        "iteration": 0,
        "epoch": t.epoch,
        "batch": t.batch,
        "sample": t.sample,
        "token": t.token,
        "epoch_in_iteration": t.epoch,
        "token_in_iteration": t.token,
        "batch_in_epoch": t.batch_in_epoch,
        "sample_in_epoch": t.sample_in_epoch,
        "token_in_epoch": t.token_in_epoch,
        "total_wct": seconds,
        "iteration_wct": seconds,
        "epoch_wct": datetime.timedelta(seconds=t.epoch_wct),
        "batch_wct": datetime.timedelta(seconds=t.batch_wct),
    }


def composer_checkpoint(state, *, optimizer_keys="name", model_prefix="", weights_only=False):
    """``state`` as Composer would have saved it (rank 0's file).

    ``optimizer_keys``: ``"name"`` (Composer on torch's state-dict API: parameter names) or
    ``"position"`` (older Composer, ``optimizer.state_dict()``: integer ids).
    ``model_prefix``: e.g. ``"module."`` for a model saved inside its DDP wrapper (Composer
    before 0.6, which also wrote ``is_model_ddp``).
    """
    model = {
        f"{model_prefix}{k}": v.detach().clone()
        for k, v in get_model_state_dict(state.model).items()
    }
    metadata = {
        "composer_env_info": {"composer_version": "0.32.1", "composer_commit_hash": None},
        "torch_version": torch.__version__,  # a TorchVersion, pickled as such
        "device": "cpu",
        "precision": "fp32",
        "world_size": 1,
        "device_train_microbatch_size": 8,
        "train_dataloader_batch_size": 16,
    }
    if weights_only:
        return {"state": {"model": model, "integrations": {}, "metadata": metadata}}
    optimizer = state.optimizers[0]
    if optimizer_keys == "name":
        named = get_optimizer_state_dict(state.model, optimizer)
        optimizer_state = {
            "state": {f"{model_prefix}{k}": v for k, v in named["state"].items()},
            "param_groups": [
                {**g, "params": [f"{model_prefix}{p}" for p in g["params"]]}
                for g in named["param_groups"]
            ],
        }
    else:
        optimizer_state = optimizer.state_dict()
    timestamp = composer_timestamp(state)
    saved = {
        "model": model,
        "optimizers": {type(optimizer).__qualname__: optimizer_state},
        "schedulers": {},
        "algorithms": [],
        "callbacks": {
            "CheckpointSaver": {"all_saved_checkpoints_to_timestamp": [("a", timestamp)]}
        },
        "scaler": {},
        "timestamp": {"Timestamp": timestamp},
        "rank_zero_seed": state.seed,
        "train_metrics": {},
        "eval_metrics": {},
        "run_name": "composer-run",
        "dataset_state": {"train": None, "eval": {}},
        "integrations": {},
        "metadata": metadata,
    }
    if model_prefix:
        saved["is_model_ddp"] = True
    rng = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.random.get_rng_state(),
    }
    return {"state": saved, "rng": [rng]}


def exp_avgs(state):
    named = get_optimizer_state_dict(state.model, state.optimizers[0])
    return {name: values["exp_avg"] for name, values in named["state"].items()}


@pytest.fixture
def composer_run(tmp_path):
    """A run stopped after 5 batches, saved in Composer's layout (and the run itself)."""
    run = trainer(max_duration=None)
    run.fit(duration="5ba")
    path = tmp_path / "ep0-ba5-rank0.pt"
    torch.save(composer_checkpoint(run.state), path)
    return run, path


def test_a_composer_run_continues_exactly_where_it_stopped(composer_run, tmp_path):
    source, path = composer_run
    resumed = trainer(tmp_path / "continued", load_path=str(path), max_duration="12ba")

    assert torch.equal(flat_params(resumed.state.model), flat_params(source.state.model))
    loaded, saved = exp_avgs(resumed.state), exp_avgs(source.state)
    assert loaded.keys() == saved.keys() and len(saved) == 4
    assert all(torch.equal(loaded[k], saved[k]) for k in saved)
    # Wall-clock times pass through Composer's timedelta (microseconds); counts are exact.
    loaded_time, saved_time = resumed.state.timestamp, source.state.timestamp
    assert loaded_time._replace(total_wct=0, epoch_wct=0, batch_wct=0) == (
        saved_time._replace(total_wct=0, epoch_wct=0, batch_wct=0)
    )
    assert loaded_time.total_wct == pytest.approx(saved_time.total_wct, abs=1e-6)
    assert resumed.state.timestamp.batch == 5

    resumed.fit()
    reference = trainer(max_duration="12ba")
    reference.fit()
    assert resumed.state.timestamp.batch == 12
    # Weights, optimizer state, time (so the data position) and random generators all came
    # over: the rest of the run is the uninterrupted one, bitwise.
    assert torch.equal(flat_params(resumed.state.model), flat_params(reference.state.model))


def test_optimizer_state_keyed_by_position_as_older_composer(composer_run, tmp_path):
    source, _ = composer_run
    path = tmp_path / "old.pt"
    torch.save(composer_checkpoint(source.state, optimizer_keys="position"), path)
    fresh = trainer()
    load_checkpoint(fresh.state, path)
    loaded, saved = exp_avgs(fresh.state), exp_avgs(source.state)
    assert all(torch.equal(loaded[k], saved[k]) for k in saved)


def test_a_file_written_under_numpy_1_loads(composer_run, tmp_path):
    """Numpy 1 names the array rebuilder numpy.core.multiarray, numpy 2 numpy._core."""
    source, path = composer_run
    old = tmp_path / "numpy1.pt"
    with zipfile.ZipFile(path) as given, zipfile.ZipFile(old, "w", zipfile.ZIP_STORED) as out:
        for info in given.infolist():
            data = given.read(info.filename)
            if info.filename.endswith("data.pkl"):
                renamed = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
                assert renamed != data or b"numpy.core.multiarray" in data
                data = renamed
            out.writestr(info, data)
    fresh = trainer()
    load_checkpoint(fresh.state, old)
    assert torch.equal(flat_params(fresh.state.model), flat_params(source.state.model))


def test_a_ddp_prefix_is_mapped_to_the_models_names(composer_run, tmp_path):
    source, _ = composer_run
    path = tmp_path / "ddp.pt"
    torch.save(composer_checkpoint(source.state, model_prefix="module."), path)
    saved_names = torch.load(path, weights_only=False)["state"]["model"].keys()
    assert "module.module.0.weight" in saved_names  # Classifier.module inside DDP.module

    fresh = trainer()
    manifest = load_checkpoint(fresh.state, path)
    assert torch.equal(flat_params(fresh.state.model), flat_params(source.state.model))
    assert all(torch.equal(exp_avgs(fresh.state)[k], v) for k, v in exp_avgs(source.state).items())
    assert manifest.format == "composer" and manifest.run_name == "composer-run"
    assert manifest.timestamp["batch"] == 5


class TinyLM(nn.Module):
    """Stands for a transformers model: ``model(**batch)`` returns its loss."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.head = nn.Linear(6, 11)

    def forward(self, input_ids, labels):
        logits = self.head(self.embed(input_ids))
        return {"loss": nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())}


def test_huggingface_model_weights_keep_their_names(tmp_path):
    torch.manual_seed(3)
    composer_side = HuggingFaceModel(TinyLM())
    saved = {f"model.{k}": v for k, v in TinyLM().state_dict().items()}  # Composer's names
    assert set(saved) == set(composer_side.state_dict())
    path = tmp_path / "hf.pt"
    torch.save({"state": {"model": saved, "integrations": {}, "metadata": {}}}, path)

    ours = HuggingFaceModel(TinyLM())
    batches = [{"input_ids": torch.randint(0, 11, (4, 5)), "labels": torch.randint(0, 11, (4, 5))}]
    run = Trainer(model=ours, train_dataloader=batches, max_duration="2ba", device="cpu",
                  progress_bar=False, seed=1)  # fmt: skip
    load_checkpoint(run.state, path, weights_only=True)
    for name, value in ours.state_dict().items():
        assert torch.equal(value, saved[name]), name
    run.fit()  # and it trains from there
    assert run.state.timestamp.batch == 2


def test_a_plain_state_dict_file_loads_as_weights(tmp_path):
    network = mlp(seed=4)
    path = tmp_path / "weights.pt"
    torch.save(network.module.state_dict(), path)  # no Classifier prefix: "0.weight", ...
    with pytest.raises(CheckpointError, match=r"holds model weights only .*weights_only=True"):
        load_checkpoint(trainer().state, path)
    fresh = trainer()
    load_checkpoint(fresh.state, path, weights_only=True)
    assert torch.equal(flat_params(fresh.state.model), flat_params(network))
    assert fresh.state.timestamp.batch == 0


def test_weights_only_composer_file(composer_run, tmp_path):
    source, _ = composer_run
    path = tmp_path / "weights.pt"
    torch.save(composer_checkpoint(source.state, weights_only=True), path)
    with pytest.raises(CheckpointError, match=r"weights only .*load it with weights_only=True"):
        load_checkpoint(trainer().state, path)
    fresh = trainer(tmp_path / "ft", load_path=str(path), load_weights_only=True)
    assert torch.equal(flat_params(fresh.state.model), flat_params(source.state.model))
    assert fresh.state.timestamp.batch == 0


def test_an_optimizer_of_another_class_starts_fresh_with_a_warning(composer_run):
    source, path = composer_run
    model = mlp(dropout=0.2)
    run = trainer(model=model)
    run.state.optimizers[0].__class__ = type("SGDW", (torch.optim.AdamW,), {})
    with pytest.warns(UserWarning, match=r"no state for the optimizer SGDW \(it has \['AdamW'\]\)"):
        load_checkpoint(run.state, path)
    assert torch.equal(flat_params(model), flat_params(source.state.model))
    assert run.state.timestamp.batch == 5


def test_ignore_keys_patterns_and_callables_see_composers_layout(composer_run):
    source, path = composer_run
    own = mlp(dropout=0.2, seed=9)
    own_head = own.module[3].weight.detach().clone()
    run = trainer(model=own)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # what was ignored on purpose is no news
        load_checkpoint(run.state, path, ignore_keys=["state/model/module.3.*", "rng"])
    assert torch.equal(own.module[3].weight, own_head)
    assert torch.equal(own.module[0].weight, source.state.model.module[0].weight)

    seen = []

    def halve_first_layer(state_dict):
        seen.append(sorted(state_dict))
        weights = state_dict["state"]["model"]
        weights["module.0.weight"] = weights["module.0.weight"] / 2

    run = trainer()
    load_checkpoint(run.state, path, ignore_keys=halve_first_layer)
    assert seen == [["rng", "state"]]  # Composer's own dict, as its callables get it
    assert torch.equal(run.state.model.module[0].weight, source.state.model.module[0].weight / 2)


def test_a_model_that_does_not_fit_is_refused_with_the_names(composer_run):
    _, path = composer_run
    wider = mlp(hidden=24)
    with pytest.raises(
        CheckpointError, match=r"other shapes: \['module\.0\.weight \(16, 8\) \(model: \(24, 8\)\)"
    ):
        load_checkpoint(trainer(model=wider).state, path)


class CreatesFile:
    """Unpickling this runs os.system: the classic pickle payload."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def test_a_pickle_payload_is_refused_without_running_it(composer_run, tmp_path):
    source, _ = composer_run
    marker = tmp_path / "pwned"
    checkpoint = composer_checkpoint(source.state)
    checkpoint["state"]["callbacks"]["Evil"] = CreatesFile(marker)
    path = tmp_path / "evil.pt"
    torch.save(checkpoint, path)
    fresh = trainer()
    before = flat_params(fresh.state.model).clone()
    with pytest.raises(UnsafeCheckpointError) as caught:
        load_checkpoint(fresh.state, path)
    message = str(caught.value)
    assert "posix.system" in message and "nothing from it was executed" in message
    assert "Only if you trust the file" in message and "torch.save(" in message
    assert not marker.exists()
    assert torch.equal(flat_params(fresh.state.model), before)  # nothing was loaded


def test_files_that_are_not_composer_checkpoints(tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match=r"garbage.pt is not a readable torch.save file"):
        load_checkpoint(trainer().state, garbage)
    other = tmp_path / "other.pt"
    torch.save({"weights": [1, 2]}, other)
    with pytest.raises(
        CheckpointError, match=r"is not a Composer checkpoint: expected .*found \['weights'\]"
    ):
        load_checkpoint(trainer().state, other)
    with pytest.raises(CheckpointError, match=r"checkpoint file .*missing.pt does not exist"):
        load_checkpoint(trainer().state, tmp_path / "missing.pt")
    with pytest.raises(CheckpointError, match=r"compressed or an archive; .*decompress it first"):
        load_checkpoint(trainer().state, tmp_path / "ep1.pt.zst")


class Reshape(Algorithm):
    """A trainkit algorithm that changes the model's structure, as Composer's BlurPool does."""

    required_on_load = True

    def match(self, event, state):
        return False

    def apply(self, event, state, logger):
        return None


def test_composers_algorithms_are_checked_against_required_on_load(
    composer_run, tmp_path, monkeypatch
):
    source, _ = composer_run
    checkpoint = composer_checkpoint(source.state)
    checkpoint["state"]["algorithms"] = [("Reshape", {"repr": "Reshape()"})]
    path = tmp_path / "surgery.pt"
    torch.save(checkpoint, path)
    # As if an installed package registered Reshape as a trainkit algorithm.
    info = composer_module.plugins.PluginInfo(
        "trainkit.algorithms", "reshape", "pkg:Reshape", "pkg"
    )
    monkeypatch.setattr(composer_module.plugins, "describe", lambda group: [info])
    monkeypatch.setattr(composer_module.plugins, "load", lambda group, name: Reshape)

    with pytest.raises(
        MissingAlgorithmError, match=r"algorithm Reshape, .*exclude_algorithms=\['Reshape'\]"
    ):
        load_checkpoint(trainer().state, path)
    fresh = trainer()
    load_checkpoint(fresh.state, path, exclude_algorithms=["Reshape"])
    assert torch.equal(flat_params(fresh.state.model), flat_params(source.state.model))


def test_a_url_is_read_through_the_storage(composer_run, s3, tmp_path):
    source, path = composer_run
    s3.client.upload_file(str(path), s3.bucket, "runs/ep0-ba5-rank0.pt")
    fresh = trainer()
    load_torch_file(
        fresh.state,
        f"{s3.url}/runs/ep0-ba5-rank0.pt",
        storage_options=s3.options,
        local_dir=tmp_path / "scratch",
    )
    assert torch.equal(flat_params(fresh.state.model), flat_params(source.state.model))
    assert list((tmp_path / "scratch").iterdir()) == []  # the download is removed
    with pytest.raises(
        CheckpointError, match=r"checkpoint file s3://.*/runs/nope.pt does not exist"
    ):
        load_torch_file(trainer().state, f"{s3.url}/runs/nope.pt", storage_options=s3.options)


FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def _load_sharded(rank, world, path):
    run = sharded_trainer(world)
    load_checkpoint(run.state, path)
    model = get_model_state_dict(run.state.model, options=FULL)
    optim = get_optimizer_state_dict(run.state.model, run.state.optimizers[0], options=FULL)
    exp_avg = {k: v["exp_avg"] for k, v in optim.get("state", {}).items()}
    return model, exp_avg, run.state.timestamp.batch


def test_loads_into_a_run_sharded_over_two_ranks(tmp_path):
    single = sharded_trainer(1, sharded=False)
    single.fit()
    path = tmp_path / "ep0-ba3-rank0.pt"
    torch.save(composer_checkpoint(single.state), path)

    (model, exp_avg, batch), (_, _, other_batch) = run_ranks(_load_sharded, 2, path)
    saved = torch.load(path, weights_only=False)["state"]
    assert model.keys() == saved["model"].keys()
    assert all(torch.equal(model[k], saved["model"][k]) for k in model)
    saved_avg = {k: v["exp_avg"] for k, v in saved["optimizers"]["AdamW"]["state"].items()}
    assert exp_avg.keys() == saved_avg.keys()
    assert all(torch.equal(exp_avg[k], saved_avg[k]) for k in exp_avg)
    assert batch == other_batch == 3
