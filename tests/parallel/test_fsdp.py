"""FSDP2 on 2 and 4 forked gloo ranks against the same training in one process."""

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_map

from multirank import run_ranks
from parallel.helpers import (
    Block,
    Blocks,
    ClipGrad,
    assert_close,
    from_bytes,
    full_weights,
    gpt2,
    import_transformers,
    loader,
    make_trainer,
    max_difference,
    oom_blocks,
    to_bytes,
    train,
)
from toy import blobs
from trainkit.core import Callback, DataSpec, Engine, Logger, MixedPrecision, Precision, State
from trainkit.core.dist import init_distributed
from trainkit.parallel import FSDP, mixed_precision_policy
from trainkit.parallel._wrap import apply_activation_checkpointing, find_blocks
from trainkit.trainer.loop import optimizer_step, train_batch

SGD = {"optimizer": "sgd"}
BF16 = {"optimizer": "sgd", "precision": "amp_bf16"}
ACCUMULATE = {"optimizer": "sgd", "device_train_microbatch_size": 2}


def _runs(world):
    """(name, strategy, training arguments, reference name) for each run at ``world``."""
    runs = [
        ("full", FSDP(), {}, "adamw"),
        ("grad_op", FSDP(sharding="grad_op"), {}, "adamw"),
        ("hybrid", FSDP(sharding="hybrid", replicate_degree=2), {}, "adamw"),
        ("none", FSDP(sharding="none"), {}, "adamw"),
        ("full_accumulate", FSDP(), ACCUMULATE, "sgd"),
        ("hybrid_checkpointed_bf16", _hybrid_checkpointed(), BF16, "bf16"),
    ]
    if world == 2:
        runs += [
            ("grad_op_accumulate", FSDP(sharding="grad_op"), ACCUMULATE, "sgd"),
            ("full_checkpointed", FSDP(activation_checkpointing=True), {}, "adamw"),
            ("full_bf16", FSDP(), BF16, "bf16"),
            ("pure_bf16", FSDP(mixed_precision="pure"), BF16, "bf16"),
            ("cpu_offload", FSDP(cpu_offload=True), {}, "adamw"),
            ("clipped", FSDP(), {"callbacks": [ClipGrad(0.05)], **SGD}, "clipped"),
            ("auto_microbatch", FSDP(), _auto_microbatch(), "sgd"),
            ("compiled_checkpointed", _compiled_checkpointed(), SGD, "sgd"),
        ]
    return runs


def _hybrid_checkpointed():
    return FSDP(sharding="hybrid", shard_degree=2, activation_checkpointing=[Block])


def _compiled_checkpointed():
    # The eager backend exercises Dynamo's capture of each block without a C++ compiler.
    return FSDP(activation_checkpointing=True, compile={"backend": "eager"})


def _auto_microbatch():
    return {"model": oom_blocks, "device_train_microbatch_size": "auto", **SGD}


def _fsdp_runs(rank, world):
    return {name: train(strategy, rank, world, **kw) for name, strategy, kw, _ in _runs(world)}


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp_trains_like_one_process(world):
    runs = run_ranks(_fsdp_runs, world)[0]
    references = {
        "adamw": train(None, 0, 1),
        "sgd": train(None, 0, 1, **SGD),
        "bf16": train(None, 0, 1, **BF16),
        "clipped": train(None, 0, 1, callbacks=[ClipGrad(0.05)], **SGD),
    }
    expected = {name: references[ref] for name, _, _, ref in _runs(world)}
    fp32 = {k: v for k, v in runs.items() if "bf16" not in k}
    assert_close(fp32, expected, 1e-5)
    # bf16 parameters under FSDP against bf16 autocast in one process: rounding differs.
    assert_close({k: v for k, v in runs.items() if "bf16" in k}, expected, 1e-3)


class ShardedGradSeen(Callback):
    """After each microbatch's backward: has FSDP reduced a gradient into the shard yet?"""

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def after_backward(self, state, logger) -> None:
        self.seen.append(state.model.head.weight.grad is not None)


def _behaviour(rank, world):
    model = Blocks()
    dtypes = []
    model.blocks[0].up.register_forward_pre_hook(lambda m, _: dtypes.append(m.weight.dtype))
    probe = ShardedGradSeen()
    trainer = make_trainer(
        FSDP(), rank, world, model=lambda: model, batches=1, precision="amp_bf16",
        device_train_microbatch_size=2, callbacks=[probe],
    )  # fmt: skip
    trainer.fit()
    state = trainer.state
    optimized = [p for g in state.optimizers[0].param_groups for p in g["params"]]
    full_precision = []
    make_trainer(
        FSDP(mixed_precision="full"), rank, world, batches=1, precision="amp_bf16",
        model=lambda: _hook_dtype(full_precision),
    ).fit()  # fmt: skip

    calls = [_count_block_calls(rank, world, checkpointed) for checkpointed in (False, True)]
    return {
        "sharded": sorted(
            n or "<root>" for n, m in model.named_modules() if isinstance(m, FSDPModule)
        ),
        "unwrap": state.parallelism.unwrap(state.model) is model,
        "optimizer_rebound": all(isinstance(p, DTensor) for p in optimized)
        and {id(p) for p in optimized} == {id(p) for p in model.parameters()},
        "compute_dtypes": (str(dtypes[0]), str(full_precision[0])),
        "grad_reduced_per_microbatch": probe.seen,
        "block_calls": tuple(calls),
        "data_parallel_size": state.data_parallel_size,
        "hybrid_data_parallel_size": FSDP(sharding="hybrid", shard_degree=1).data_parallel_size,
    }


def _count_block_calls(rank, world, checkpointed):
    model, calls = Blocks(), []
    for block in model.blocks:
        block.register_forward_pre_hook(lambda *_: calls.append(1))
    strategy = FSDP(activation_checkpointing=checkpointed)
    make_trainer(strategy, rank, world, model=lambda: model, batches=1).fit()
    return len(calls)


def _hook_dtype(dtypes):
    model = Blocks()
    model.blocks[0].up.register_forward_pre_hook(lambda m, _: dtypes.append(m.weight.dtype))
    return model


def test_fsdp_shards_blocks_rebinds_optimizers_and_skips_sync_until_the_last_microbatch():
    for result in run_ranks(_behaviour, 2):
        assert result == {
            "sharded": ["<root>", "blocks.0", "blocks.1", "blocks.2"],
            "unwrap": True,
            "optimizer_rebound": True,
            "compute_dtypes": ("torch.bfloat16", "torch.float32"),  # "default", "full"
            "grad_reduced_per_microbatch": [False, False, False, True],
            "block_calls": (3, 6),  # checkpointed blocks run forward again in backward
            "data_parallel_size": 2,
            "hybrid_data_parallel_size": 2,  # before prepare: from the world size
        }


def _clone(state_dict):
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, state_dict)


def _resume(rank, world):
    whole = make_trainer(FSDP(), rank, world, batches=4)
    whole.fit()
    first = make_trainer(FSDP(), rank, world, batches=4)
    first.fit(duration="2ba")
    saved = _clone(first.state.state_dict())
    resumed = make_trainer(FSDP(), rank, world, batches=4)
    resumed.state.load_state_dict(saved)
    resumed.fit()
    a, b = full_weights(whole.state.model), full_weights(resumed.state.model)
    moments = saved["optimizers"][0]["state"]["blocks.0.up.weight"]["exp_avg"]
    return {
        "bitwise": a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a),
        "batches": int(resumed.state.timestamp.batch),
        "optimizer_state_sharded": isinstance(moments, DTensor),
    }


def test_state_dict_resumes_bitwise_under_fsdp():
    for result in run_ranks(_resume, 2):
        assert result == {"bitwise": True, "batches": 4, "optimizer_state_sharded": True}


def _hugging_face(rank, world):
    trainer = make_trainer(FSDP(activation_checkpointing=True), rank, world, model=gpt2, **SGD)
    trainer.fit()
    model = trainer.state.model
    sharded = sorted(n for n, m in model.named_modules() if isinstance(m, FSDPModule))
    return sharded, to_bytes(full_weights(model)), trainer.hyperparameters()["model"]


def test_wrap_auto_shards_each_hugging_face_block():
    import_transformers()
    sharded, weights, logged_name = run_ranks(_hugging_face, 2)[0]
    assert sharded == ["", "model.transformer.h.0", "model.transformer.h.1"]
    assert logged_name == "HuggingFaceModel"  # not fully_shard's FSDPHuggingFaceModel
    assert_close({"gpt2": weights}, {"gpt2": train(None, 0, 1, model=gpt2, **SGD)}, 1e-5)


def _scaler(rank, world):
    # amp_fp16 needs CUDA (make_precision refuses it elsewhere), so the fp16 precision is
    # set on a hand-built state: FSDP must give one whose scaler agrees across ranks
    # whether to skip the step, with the settings of the scaler it replaces.
    model = Blocks()
    fp16 = MixedPrecision(
        "cpu", torch.float16, scaler_factory=lambda: torch.amp.GradScaler("cpu", init_scale=4.0)
    )
    state = State(
        model=model, train_data=DataSpec(loader(blobs(64, seed=1), rank, world)), precision=fp16
    )
    strategy = FSDP()
    strategy.prepare(state)
    state.precision = strategy.precision_for(state.precision)
    sharded = type(state.precision.scaler).__name__
    state.optimizers = [torch.optim.SGD(model.parameters(), lr=0.1)]
    state.batch = next(iter(state.train_data.dataloader))
    train_batch(state, Engine(state, Logger([], state)))
    before = [p.detach().to_local().clone() for p in model.parameters()]
    if rank == 1:  # an overflow on one rank's shard only
        model.head.weight.grad.to_local().fill_(float("inf"))
    optimizer_step(state)
    after = [p.detach().to_local() for p in model.parameters()]
    skipped = all(torch.equal(x, y) for x, y in zip(before, after, strict=True))
    return sharded, skipped, state.precision.scaler.get_scale()


def test_grad_scaler_skips_the_step_on_every_rank_when_one_overflows():
    expected = ("ShardedGradScaler", True, 2.0)
    assert run_ranks(_scaler, 2) == [expected, expected]


def test_precision_without_loss_scaling_is_kept():
    for precision in (Precision(), MixedPrecision("cpu", torch.bfloat16)):
        assert FSDP().precision_for(precision) is precision


def _single_process(rank, world):
    torch.distributed.destroy_process_group()  # the harness's; start one as a script would
    started = init_distributed(env={})
    weights = train(FSDP(), 0, 1)  # the same script, one process
    return started, torch.distributed.get_world_size(), weights


def test_fsdp_trains_alone_in_the_one_rank_group_init_distributed_starts():
    started, world, weights = run_ranks(_single_process, 1)[0]
    assert (started, world) == (True, 1)
    assert max_difference(weights, train(None, 0, 1)) < 1e-6


def _already_sharded(rank, world):
    model = Blocks()
    fully_shard(model.blocks[1])
    try:
        make_trainer(FSDP(), rank, world, model=lambda: model)
    except TypeError as err:
        return str(err)
    return "no error"


def test_fsdp_rejects_a_model_already_sharded():
    message = run_ranks(_already_sharded, 2)[0]
    assert "already distributed" in message and "'blocks.1'" in message


def test_mixed_precision_presets():
    bf16, fp32 = torch.bfloat16, torch.float32
    amp_bf16, amp_fp16, fp32_precision = (
        MixedPrecision("cpu", bf16),
        MixedPrecision("cpu", torch.float16),
        Precision(),
    )
    assert mixed_precision_policy("default", amp_bf16) == MixedPrecisionPolicy(
        param_dtype=bf16, reduce_dtype=fp32
    )
    assert mixed_precision_policy("pure", amp_bf16) == MixedPrecisionPolicy(
        param_dtype=bf16, reduce_dtype=bf16
    )
    assert mixed_precision_policy("default", amp_fp16) == MixedPrecisionPolicy(
        param_dtype=torch.float16, reduce_dtype=fp32
    )
    assert mixed_precision_policy("full", amp_bf16) == MixedPrecisionPolicy()
    assert mixed_precision_policy("pure", fp32_precision) == MixedPrecisionPolicy()
    custom = MixedPrecisionPolicy(param_dtype=torch.float16)
    assert mixed_precision_policy(custom, fp32_precision) is custom


def test_degrees_follow_the_sharding():
    dims = FSDP(sharding="hybrid", replicate_degree=2).dims(8)
    assert (dims.replicate, dims.shard, dims.tensor) == (2, 4, 1)
    dims = FSDP(sharding="hybrid", shard_degree=2).dims(8)
    assert (dims.replicate, dims.shard) == (4, 2)
    assert (FSDP().dims(4).shard, FSDP(sharding="none").dims(4).replicate) == (4, 4)


def test_fsdp_bad_input():
    with pytest.raises(ValueError, match=r"sharding 'zero3' is not known; use one of \['full'"):
        FSDP(sharding="zero3")
    with pytest.raises(ValueError, match="mixed_precision 'bf16' is not known"):
        FSDP(mixed_precision="bf16")
    with pytest.raises(ValueError, match="shard_degree must be a positive int or None, got 0"):
        FSDP(shard_degree=0)
    with pytest.raises(ValueError, match=r"needs replicate_degree or shard_degree .* \[1, 2, 4\]"):
        FSDP(sharding="hybrid").dims(4)
    with pytest.raises(ValueError, match=r"replicate_degree=3 does not fit 4 data-parallel"):
        FSDP(sharding="hybrid", replicate_degree=3).dims(4)
    with pytest.raises(ValueError, match=r"sharding='full'\) got replicate_degree=2"):
        FSDP(replicate_degree=2).dims(4)
    with pytest.raises(ValueError, match=r"sharding='none'\) got shard_degree=2"):
        FSDP(sharding="none", shard_degree=2).dims(4)
    with pytest.raises(TypeError, match="tensor_parallel must be a TensorParallel"):
        FSDP(tensor_parallel={"*": "colwise"})
    with pytest.raises(ValueError, match="wrap 'blocks' is not known"):
        find_blocks(Blocks(), "blocks")
    with pytest.raises(TypeError, match=r"wrap must be nn\.Module classes or a callable"):
        find_blocks(Blocks(), [Block, "Linear"])
    with pytest.raises(ValueError, match="activation_checkpointing=True checkpoints the FSDP"):
        apply_activation_checkpointing(nn.Linear(2, 2), True, blocks=[])
    with pytest.raises(RuntimeError, match=r"init_distributed\(\)"):
        FSDP().prepare(State(model=Blocks()))


def _broadcasts(rank, world):
    torch.manual_seed(rank)  # each rank starts from weights of its own
    model = nn.Linear(3, 2)
    import torch.distributed as dist

    from trainkit.parallel._common import broadcast_module_states

    calls, real = [], dist.broadcast
    dist.broadcast = lambda tensor, src, **kw: calls.append(src) or real(tensor, src, **kw)
    try:
        broadcast_module_states(model)
    finally:
        dist.broadcast = real
    return len(calls), to_bytes(model.state_dict())


def test_module_states_are_broadcast_from_rank_0_and_not_at_all_alone():
    ((alone, _),) = run_ranks(_broadcasts, 1)
    assert alone == 0  # one rank: nothing to copy, no collective per tensor
    (calls_0, weights_0), (calls_1, weights_1) = run_ranks(_broadcasts, 2)
    assert calls_0 == calls_1 == 2  # the weight and the bias
    for name, tensor in from_bytes(weights_0).items():
        assert torch.equal(from_bytes(weights_1)[name], tensor), name
