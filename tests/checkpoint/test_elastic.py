"""Elastic: saved sharded (FSDP2) on N ranks, loaded on M ranks or in one process."""

import pytest
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from ckpt_runs import sharded_trainer
from multirank import run_ranks
from trainkit.checkpoint import load_checkpoint, save_checkpoint

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def _full(state):
    model = get_model_state_dict(state.model, options=FULL)
    optim = get_optimizer_state_dict(state.model, state.optimizers[0], options=FULL)
    # Full tensors are gathered on rank 0 only (the others get empty dicts).
    return {"model": model, "optim": {k: v["exp_avg"] for k, v in optim.get("state", {}).items()}}


def _save(rank, world, folder):
    run = sharded_trainer(world)
    run.fit()
    save_checkpoint(run.state, folder)
    return _full(run.state)


def _load(rank, world, folder):
    run = sharded_trainer(world)
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

    single = sharded_trainer(1, sharded=False)  # no process group, no sharding
    with pytest.warns(UserWarning, match="saved run had 4 ranks"):
        load_checkpoint(single.state, tmp_path / "ckpt")
    _assert_equal(_full(single.state)["model"], saved["model"])
    _assert_equal(_full(single.state)["optim"], saved["optim"])
