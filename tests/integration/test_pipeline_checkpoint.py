"""Checkpoints of a pipeline-parallel Llama: across pipeline degrees, after kill -9, and of
FSDP x TP x PP (2x2x2) on 1, 2 and 4 ranks.

Each stage saves the parameters it holds under the model's own names, so the checkpoint
of a 2-stage run is the checkpoint of one model: it loads into one process bitwise, and
one process's checkpoint loads into 2 stages.
"""

import os
import signal
import warnings

import pytest
import torch
import torch.distributed.pipelining  # once here, not in each forked rank

from multirank import run_ranks
from parallel.helpers import (
    LossLog,
    from_bytes,
    full_weights,
    import_transformers,
    llama,
    make_trainer,
    pipeline_with_fsdp,
    stage_weights,
    to_bytes,
)
from trainkit.checkpoint import load_checkpoint, save_checkpoint
from trainkit.core import Callback
from trainkit.parallel import PipelineParallel

MICROBATCH = {"device_train_microbatch_size": 4}


def _pipeline(rank, world, **kwargs):
    return make_trainer(
        PipelineParallel(plan="llama"), rank, world, model=llama, tensor=world,
        **MICROBATCH, **kwargs,
    )  # fmt: skip


def _single(**kwargs):
    return make_trainer(None, 0, 1, model=llama, **MICROBATCH, **kwargs)


def _tensors(state):
    """Every parameter and AdamW moment this rank holds, by parameter name."""
    names = {id(p): n for n, p in state.model.named_parameters()}
    out = {f"param/{n}": p.detach().clone() for n, p in state.model.named_parameters()}
    for param, values in state.optimizers[0].state.items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            out[f"{key}/{names[id(param)]}"] = values[key].detach().clone()
    return out


def _load_quietly(state, folder):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the saved run had 2 ranks and this one has 1"
        load_checkpoint(state, folder, ignore_keys=["data", "rng"])


def _save_on_two_stages(rank, world, folder):
    trainer = _pipeline(rank, world, batches=2)
    trainer.fit()
    save_checkpoint(trainer.state, folder)
    return to_bytes(_tensors(trainer.state))


def _load_on_two_stages(rank, world, folder):
    trainer = _pipeline(rank, world, batches=2)
    _load_quietly(trainer.state, folder)
    return to_bytes(_tensors(trainer.state))


def _assert_equal(a, b):
    assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, different


def _one_process(rank, world, source, target):
    # One process (a 1-rank child: one thread, as the stages have) loads the 2 stages'
    # checkpoint, trains one more batch and saves it for the stages to load back.
    single = _single(batches=2)
    _load_quietly(single.state, source)
    loaded, batch = to_bytes(_tensors(single.state)), int(single.state.timestamp.batch)
    single.fit(duration="1ba")
    save_checkpoint(single.state, target)
    return loaded, batch, to_bytes(_tensors(single.state))


def test_two_stage_checkpoint_loads_in_one_process_and_back(tmp_path):
    import_transformers()
    saved = {}
    for blob in run_ranks(_save_on_two_stages, 2, str(tmp_path / "pp2")):
        saved.update(from_bytes(blob))
    ((loaded, batch, trained),) = run_ranks(
        _one_process, 1, str(tmp_path / "pp2"), str(tmp_path / "one")
    )
    _assert_equal(from_bytes(loaded), saved)  # bitwise, moments and steps included
    assert batch == 2
    back = {}
    for blob in run_ranks(_load_on_two_stages, 2, str(tmp_path / "one")):
        back.update(from_bytes(blob))
    _assert_equal(back, from_bytes(trained))


class KillAt(Callback):
    """SIGKILLs the process at the end of batch ``batch`` (before its checkpoint event)."""

    def __init__(self, batch):
        self.batch = batch

    def batch_end(self, state, logger):
        if state.timestamp.batch == self.batch:
            os.kill(os.getpid(), signal.SIGKILL)


def _run(rank, world, folder, kill_at=None):
    callbacks = [KillAt(kill_at)] if kill_at is not None else []
    trainer = _pipeline(
        rank, world, batches=3, callbacks=callbacks, save_folder=folder, save_interval="2ba",
        autoresume=True, run_name="pp",
    )  # fmt: skip
    resumed_at = int(trainer.state.timestamp.batch)
    trainer.fit()
    return resumed_at, to_bytes(_tensors(trainer.state))


def test_kill_9_then_resume_under_pipeline_parallel_is_exact(tmp_path):
    import_transformers()
    full = run_ranks(_run, 2, str(tmp_path / "full"))
    with pytest.raises(AssertionError, match="exited without a result"):
        run_ranks(_run, 2, str(tmp_path / "killed"), 3)
    resumed = run_ranks(_run, 2, str(tmp_path / "killed"))
    assert [r[0] for r in resumed] == [2, 2]  # from the checkpoint of batch 2
    for (_, uninterrupted), (_, again) in zip(full, resumed, strict=True):
        _assert_equal(from_bytes(again), from_bytes(uninterrupted))


def _three_d(rank, world, folder):
    log = LossLog()
    # SGD: AdamW would scale the tensor-parallel reductions' float rounding up to ~1e-5.
    trainer = pipeline_with_fsdp(rank, tensor=2, callbacks=[log], optimizer="sgd")
    trainer.fit()
    save_checkpoint(trainer.state, folder)
    return to_bytes(stage_weights(trainer.state.model)), log.losses


def _load_weights(rank, world, folder, fsdp):
    if fsdp:
        trainer = pipeline_with_fsdp(rank, optimizer="sgd")
    else:
        trainer = _pipeline(rank, world, batches=2, optimizer="sgd")
    _load_quietly(trainer.state, folder)
    return to_bytes(stage_weights(trainer.state.model))


def _one_process_3d(rank, world, folder):
    single = _single(batches=2, callbacks=[LossLog()], optimizer="sgd")
    single.fit()
    fresh = _single(batches=2, optimizer="sgd")
    _load_quietly(fresh.state, folder)
    trained = to_bytes(full_weights(single.state.model))
    return trained, single.state.callbacks[0].losses, to_bytes(stage_weights(fresh.state.model))


def test_fsdp_tp_pp_trains_like_one_process_and_loads_on_1_2_and_4_ranks(tmp_path):
    # 8 ranks: 2 pipeline stages x 2 FSDP shards x 2 tensor-parallel ranks.
    import_transformers()
    folder = str(tmp_path / "3d")
    ranks = run_ranks(_three_d, 8, folder)
    weights = {}
    for blob, _ in ranks:
        weights.update(from_bytes(blob))
    ((reference, reference_losses, loaded),) = run_ranks(_one_process_3d, 1, folder)
    reference = from_bytes(reference)
    assert weights.keys() == reference.keys()
    assert max((weights[k] - reference[k]).abs().max().item() for k in weights) < 1e-5
    for _, losses in ranks:  # every rank reports the batch's loss
        assert losses == pytest.approx(reference_losses, abs=1e-5)
    _assert_equal(from_bytes(loaded), weights)  # 1 process, bitwise
    for world, fsdp in ((2, False), (4, True)):  # 2 stages; 2 stages x 2 shards
        loaded = {}
        for blob in run_ranks(_load_weights, world, folder, fsdp):
            loaded.update(from_bytes(blob))
        _assert_equal(loaded, weights)
