"""Tensor parallel (2 ranks) and FSDP x tensor parallel (4 ranks) against one process."""

import copy

import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor

from multirank import run_ranks
from parallel.helpers import (
    BLOCKS_TP_PLAN,
    Blocks,
    MaskedTokens,
    assert_close,
    gpt2,
    import_transformers,
    llama,
    make_trainer,
    train,
)
from trainkit.parallel import (
    FSDP,
    FusedColwiseParallel,
    ShardedAttributes,
    TensorParallel,
    expand_plan,
    gpt2_plan,
    llama_plan,
)

SGD = {"optimizer": "sgd"}
MODELS = {"blocks": Blocks, "gpt2": gpt2, "llama": llama, "llama_sp": llama}


def _plan(name, degree=None):
    plans = {
        "blocks": BLOCKS_TP_PLAN,
        "gpt2": gpt2_plan(),
        "llama": llama_plan(),
        "llama_sp": llama_plan(sequence_parallel=True),
    }
    return TensorParallel(plan=plans[name], degree=degree)


def _tensor_parallel_runs(rank, world):
    runs = {
        name: train(_plan(name), rank, world, model=make, tensor=world, **SGD)
        for name, make in MODELS.items()
    }
    trainer = make_trainer(_plan("gpt2"), rank, world, model=gpt2, tensor=world, batches=1)
    attention = trainer.state.model.model.transformer.h[0].attn
    layout = {
        "c_attn": (tuple(attention.c_attn.weight.shape), attention.c_attn.weight.to_local().shape),
        "c_fc": tuple(trainer.state.model.model.transformer.h[0].mlp.c_fc.weight.to_local().shape),
        "split_size": attention.split_size,
        "unwrap": trainer.state.parallelism.unwrap(trainer.state.model) is trainer.state.model,
    }
    trainer.fit()
    # The ranks share one batch: it is counted once.
    layout["counted"] = (trainer.state.data_parallel_size, int(trainer.state.timestamp.sample))
    return runs, layout


def test_tensor_parallel_trains_like_one_process():
    import_transformers()
    (runs, layout), _ = run_ranks(_tensor_parallel_runs, 2)
    references = {name: train(None, 0, 1, model=make, **SGD) for name, make in MODELS.items()}
    assert_close(runs, references, 1e-5)
    # GPT-2's fused q/k/v: each rank holds half of each of q, k and v (96 / 2 = 48 columns).
    assert layout["c_attn"] == ((32, 96), (32, 48))
    assert layout["c_fc"] == (32, 64)  # Conv1D (in, out): column-wise shards dim 1
    assert layout["split_size"] == 16
    assert layout["unwrap"]
    assert layout["counted"] == (1, 16)  # one global batch of 16 samples


def _fsdp_tensor_parallel_runs(rank, world):
    runs = {}
    for name in ("blocks", "gpt2", "llama_sp"):
        strategy = FSDP(tensor_parallel=_plan(name, degree=2))
        runs[name] = train(strategy, rank, world, model=MODELS[name], tensor=2, **SGD)
    # Slices with different numbers of label tokens: each weighs by its tokens, and the
    # tensor-parallel peers that share a slice count it once.
    runs["gpt2, masked"] = train(
        FSDP(tensor_parallel=_plan("gpt2", degree=2)),
        rank, world, model=gpt2, tensor=2, data=MaskedTokens(), **SGD,
    )  # fmt: skip
    trainer = make_trainer(FSDP(tensor_parallel=_plan("blocks", 2)), rank, world, tensor=2)
    weight = trainer.state.model.blocks[0].up.weight
    mesh = (weight.device_mesh.mesh_dim_names, len(weight.placements))
    trainer.fit()
    return runs, mesh, (trainer.state.data_parallel_size, int(trainer.state.timestamp.sample))


def test_fsdp_with_tensor_parallel_trains_like_one_process():
    import_transformers()
    runs, (mesh_dims, placements), counted = run_ranks(_fsdp_tensor_parallel_runs, 4)[0]
    references = {name: train(None, 0, 1, model=MODELS[name], **SGD) for name in MODELS}
    references["gpt2, masked"] = train(None, 0, 1, model=gpt2, data=MaskedTokens(), **SGD)
    assert_close(runs, {name: references[name] for name in runs}, 1e-5)
    assert (mesh_dims, placements) == (("shard", "tensor"), 2)  # 2-D: FSDP x TP
    # 2 data-parallel groups of 2 tensor-parallel ranks: 3 global batches of 16 samples.
    assert counted == (2, 48)


def _fused_linear(rank, world):
    # nn.Linear(8, 12) as three fused blocks of 4 features; this rank computes 2 of each.
    from torch.distributed.device_mesh import init_device_mesh

    from trainkit.parallel import FusedColwiseParallel, apply_tensor_parallel

    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(8, 12))
    inputs, upstream = torch.randn(5, 8), torch.randn(5, 12)
    model = copy.deepcopy(reference)
    plan = {"0": FusedColwiseParallel(use_local_output=False)}
    apply_tensor_parallel(model, plan, init_device_mesh("cpu", (world,)))
    mine = torch.cat(
        [torch.arange(4 * block + 2 * rank, 4 * block + 2 * rank + 2) for block in range(3)]
    )
    x, x_ref = inputs.clone().requires_grad_(), inputs.clone().requires_grad_()
    output, expected = model(x), reference(x_ref)
    (output.to_local() * upstream[:, mine]).sum().backward()
    (expected * upstream).sum().backward()
    linear, linear_ref = model[0], reference[0]
    return {
        "placements": repr(output.placements),
        "output": (output.to_local() - expected[:, mine]).abs().max().item(),
        "input grad": (x.grad - x_ref.grad).abs().max().item(),
        "weight grad": (linear.weight.grad.to_local() - linear_ref.weight.grad[mine])
        .abs()
        .max()
        .item(),
        "bias grad": (linear.bias.grad.to_local() - linear_ref.bias.grad).abs().max().item(),
    }


def test_fused_linear_computes_each_ranks_blocks_and_the_whole_gradients():
    for result in run_ranks(_fused_linear, 2):
        assert result.pop("placements") == "(_StridedShard(dim=1, sf=3),)"
        # The input's partial gradients are summed over ranks, the bias's slices gathered.
        assert max(result.values()) < 1e-6, result


def test_plan_naming_missing_modules_lists_candidates():
    with pytest.raises(ValueError) as caught:
        expand_plan(Blocks(), {"blocks.*.upp": "colwise"})
    message = str(caught.value)
    assert "'blocks.*.upp' matches no module of Blocks" in message
    assert "blocks.0.up" in message  # the closest names are listed
    with pytest.raises(ValueError, match="matched by two tensor-parallel plan entries"):
        expand_plan(Blocks(), {"blocks.0.*": "colwise", "*.up": "colwise"})
    assert sorted(expand_plan(Blocks(depth=2), BLOCKS_TP_PLAN)) == [
        "blocks.0.down", "blocks.0.up", "blocks.1.down", "blocks.1.up",
    ]  # fmt: skip


def test_tensor_parallel_bad_input():
    with pytest.raises(TypeError, match=r"style 'columns'; use a ParallelStyle .*'colwise'"):
        TensorParallel(plan={"blocks.*.up": "columns"})
    with pytest.raises(TypeError, match="non-empty mapping"):
        TensorParallel(plan={})
    with pytest.raises(ValueError, match="degree must be a positive int, got 0"):
        TensorParallel(plan=BLOCKS_TP_PLAN, degree=0)
    with pytest.raises(ValueError, match=r"needs the tensor-parallel degree"):
        FSDP(tensor_parallel=TensorParallel(plan=BLOCKS_TP_PLAN)).dims(4)
    with pytest.raises(
        ValueError, match="tensor-parallel degree 3 does not divide the world size 4"
    ):
        FSDP(tensor_parallel=TensorParallel(plan=BLOCKS_TP_PLAN, degree=3)).dims(4)

    class ThreeRanks:
        def size(self):
            return 3

    with pytest.raises(ValueError, match=r"12 output features over 3 ranks: .* divisible by 9"):
        FusedColwiseParallel(chunks=3)._apply(nn.Linear(4, 12), ThreeRanks())

    attention = nn.Module()
    attention.split_size = 32
    with pytest.raises(ValueError, match="split_size = 32 is not divisible by the tensor-parallel"):
        ShardedAttributes("split_size")._apply(attention, ThreeRanks())


def _errors_on_ranks(rank, world):
    messages = {}
    cases = {
        "degree": lambda: make_trainer(TensorParallel(plan=BLOCKS_TP_PLAN, degree=1), rank, world),
        "style": lambda: make_trainer(
            TensorParallel(plan={"blocks.0.norm": "colwise"}), rank, world
        ),
        "wrapped": lambda: make_trainer(
            FSDP(), rank, world, model=lambda: _tensor_parallel_blocks(world)
        ),
    }
    for name, build in cases.items():
        try:
            build()
            messages[name] = "no error"
        except (TypeError, ValueError) as err:
            messages[name] = f"{type(err).__name__}: {err}"
    return messages


def _tensor_parallel_blocks(world):
    from torch.distributed.device_mesh import init_device_mesh

    from trainkit.parallel import apply_tensor_parallel

    model = Blocks()
    apply_tensor_parallel(model, BLOCKS_TP_PLAN, init_device_mesh("cpu", (world,)))
    assert isinstance(model.blocks[0].up.weight, DTensor)
    return model


def test_tensor_parallel_errors_that_need_ranks():
    messages = run_ranks(_errors_on_ranks, 2)[0]
    assert messages["degree"].startswith("ValueError: TensorParallel(degree=1) alone must span")
    assert "FSDP(tensor_parallel=TensorParallel(plan=plan, degree=1))" in messages["degree"]
    assert messages["style"].startswith("TypeError: tensor-parallel style ColwiseParallel(")
    assert "cannot shard module 'blocks.0.norm' (LayerNorm)" in messages["style"]
    assert messages["wrapped"].startswith("TypeError: FSDP got a model whose parameter")
    assert "already a DTensor" in messages["wrapped"]
