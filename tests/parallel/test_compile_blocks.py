"""``Trainer(compile=...)`` under the sharding strategies: each sharded block is compiled."""

import torch

from multirank import run_ranks
from parallel.helpers import (
    BLOCKS_TP_PLAN,
    Blocks,
    from_bytes,
    full_weights,
    make_trainer,
    to_bytes,
    train,
)
from trainkit.parallel import DDP, FSDP, TensorParallel

AOT = {"backend": "aot_eager"}


def _compiled_fsdp(rank, world):
    trainer = make_trainer(FSDP(), rank, world, compile=AOT)
    trainer.fit()
    model = trainer.state.model
    return {
        "blocks_compiled": [b._compiled_call_impl is not None for b in model.blocks],
        "root_compiled": model._compiled_call_impl is not None,
        "names": sorted(model.state_dict()) == sorted(Blocks().state_dict()),
        "weights": to_bytes(full_weights(model)),
    }


def test_fsdp_compiles_each_sharded_block_and_trains_like_eager():
    result = run_ranks(_compiled_fsdp, 2)[0]
    reference = from_bytes(train(None, 0, 1))
    weights = from_bytes(result.pop("weights"))
    assert result == {"blocks_compiled": [True] * 3, "root_compiled": False, "names": True}
    assert weights.keys() == reference.keys()
    for name, value in reference.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-5)


def _compiled_ddp(rank, world):
    trainer = make_trainer(DDP(), rank, world, compile=AOT)
    trainer.fit()
    wrapper = trainer.state.model
    inner = trainer.state.parallelism.unwrap(wrapper)
    return {
        "inner_compiled": inner._compiled_call_impl is not None,  # eval and predict use it too
        "weights": to_bytes({k: v.detach().clone() for k, v in inner.state_dict().items()}),
    }


def test_ddp_compiles_the_users_module_and_trains_like_eager():
    result = run_ranks(_compiled_ddp, 2)[0]
    reference = from_bytes(train(None, 0, 1))
    weights = from_bytes(result.pop("weights"))
    assert result == {"inner_compiled": True}
    assert weights.keys() == reference.keys()
    for name, value in reference.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-5)


def test_the_hook_compiles_blocks_or_else_the_whole_model():
    model = Blocks()
    TensorParallel(plan=BLOCKS_TP_PLAN).compile(model, AOT)
    assert [b._compiled_call_impl is not None for b in model.blocks] == [True] * 3
    assert model._compiled_call_impl is None
    unprepared = Blocks()
    FSDP().compile(unprepared, AOT)  # no blocks were sharded: the whole model
    assert unprepared._compiled_call_impl is not None
