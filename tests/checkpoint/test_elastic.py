"""Elastic: saved sharded (FSDP2) on N ranks, loaded on M ranks or in one process."""

import contextlib

import pytest
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler

from multirank import run_ranks
from toy import blobs, mlp
from trainkit.checkpoint import load_checkpoint, save_checkpoint
from trainkit.core import Trainer

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


class Shard:
    """FSDP2 on every Linear and the root: enough of a strategy to shard the checkpoint."""

    def prepare(self, state):
        for module in state.model.modules():
            if isinstance(module, torch.nn.Linear):
                fully_shard(module)
        fully_shard(state.model)

    def no_sync(self, model):
        return contextlib.nullcontext()

    def unwrap(self, model):
        return model


def _trainer(sharded: bool, world: int):
    data = blobs(128)
    sampler = DistributedSampler(data, shuffle=False) if world > 1 else None
    return Trainer(
        model=mlp(dropout=0.0, hidden=24),
        train_dataloader=DataLoader(data, batch_size=8, sampler=sampler),
        max_duration="3ba",
        parallelism=Shard() if sharded else None,
        progress_bar=False,
        device="cpu",
        seed=2,
    )


def _full(state):
    model = get_model_state_dict(state.model, options=FULL)
    optim = get_optimizer_state_dict(state.model, state.optimizers[0], options=FULL)
    # Full tensors are gathered on rank 0 only (the others get empty dicts).
    return {"model": model, "optim": {k: v["exp_avg"] for k, v in optim.get("state", {}).items()}}


def _save(rank, world, folder):
    run = _trainer(True, world)
    run.fit()
    save_checkpoint(run.state, folder)
    return _full(run.state)


def _load(rank, world, folder):
    run = _trainer(True, world)
    with pytest.warns(UserWarning, match="saved run had 4 ranks and this one has 2"):
        load_checkpoint(run.state, folder)
    return _full(run.state), run.state.timestamp.batch


def _assert_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_save_on_4_ranks_load_on_2_and_on_1(tmp_path):
    saved = run_ranks(_save, 4, tmp_path / "ckpt")[0]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.suffix == ".distcp") == [
        f"__{r}_0.distcp" for r in range(4)
    ]

    (loaded, batch), (_, other_batch) = run_ranks(_load, 2, tmp_path / "ckpt")
    assert len(saved["model"]) == 4 and len(saved["optim"]) == 4
    _assert_equal(loaded["model"], saved["model"])
    _assert_equal(loaded["optim"], saved["optim"])
    assert batch == other_batch == 3

    single = _trainer(False, 1)  # no process group, no sharding
    with pytest.warns(UserWarning, match="saved run had 4 ranks"):
        load_checkpoint(single.state, tmp_path / "ckpt")
    _assert_equal(_full(single.state)["model"], saved["model"])
    _assert_equal(_full(single.state)["optim"], saved["optim"])
