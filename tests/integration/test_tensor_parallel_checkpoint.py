"""Sharded checkpoints and exports of a tensor-parallel GPT-2 on 2 ranks.

Its fused q/k/v projection (``FusedColwiseParallel``) leaves each rank three blocks of the
weight and of its optimizer state, one per q, k and v. The checkpoint must hold them in
the unsharded layout, resume exactly, and load into one process; an export gathers them.
"""

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.tensor import DTensor

from multirank import run_ranks
from parallel.helpers import gpt2, import_transformers, make_trainer, to_bytes
from trainkit.checkpoint import ExportOnFitEnd, load_checkpoint, save_checkpoint
from trainkit.parallel import FSDP, TensorParallel, gpt2_plan

C_ATTN = "h.0.attn.c_attn.weight"


def _tensor_parallel(rank, world, batches=2, degree=None, **kwargs):
    if degree is None:  # all ranks one tensor-parallel group
        strategy, degree = TensorParallel(plan=gpt2_plan()), world
    else:  # FSDP over groups of `degree` tensor-parallel ranks
        strategy = FSDP(tensor_parallel=TensorParallel(plan=gpt2_plan(), degree=degree))
    return make_trainer(strategy, rank, world, model=gpt2, tensor=degree, batches=batches, **kwargs)


def _local(trainer):
    """This rank's part of every parameter and optimizer-state tensor, as plain tensors."""
    state = trainer.state
    tensors = {f"param/{n}": p for n, p in state.model.named_parameters()}
    for index, values in enumerate(state.optimizers[0].state.values()):
        tensors.update({f"opt/{index}/{k}": v for k, v in values.items()})
    return to_bytes(
        {
            k: (v.to_local() if isinstance(v, DTensor) else v).detach().clone()
            for k, v in tensors.items()
        }
    )


def _resume(rank, world, folder, async_save, degree=None):
    uninterrupted = _tensor_parallel(rank, world, degree=degree)
    uninterrupted.fit()
    first = _tensor_parallel(rank, world, degree=degree)
    first.fit(duration="1ba")
    save_checkpoint(first.state, folder, async_save=async_save).wait()
    resumed = _tensor_parallel(rank, world, degree=degree)
    load_checkpoint(resumed.state, folder)
    resumed.fit()
    return _local(uninterrupted), _local(resumed), int(resumed.state.timestamp.batch)


@pytest.mark.parametrize("async_save", [False, True])
def test_tensor_parallel_gpt2_resumes_exactly_from_a_sharded_checkpoint(tmp_path, async_save):
    import_transformers()
    folder = tmp_path / "ba1"
    for uninterrupted, resumed, batch in run_ranks(_resume, 2, str(folder), async_save):
        assert batch == 2
        assert uninterrupted == resumed  # bitwise: weights, AdamW's moments and step counts
    # The fused weight is stored whole (32 x 96), as three blocks of 32 x 16 from each rank.
    metadata = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    (key,) = [k for k in metadata if k.startswith("state.model.") and k.endswith(C_ATTN)]
    chunks = sorted((tuple(c.offsets), tuple(c.sizes)) for c in metadata[key].chunks)
    assert metadata[key].size == torch.Size([32, 96])
    assert chunks == [((0, 16 * i), (32, 16)) for i in range(6)]


def test_fsdp_with_tensor_parallel_gpt2_resumes_exactly_from_a_sharded_checkpoint(tmp_path):
    # 4 ranks: FSDP shards c_attn's rows over 2 groups, each of 2 tensor-parallel ranks with
    # three column blocks: every rank saves three blocks of 16 x 16.
    import_transformers()
    folder = tmp_path / "ba1"
    for uninterrupted, resumed, batch in run_ranks(_resume, 4, str(folder), False, 2):
        assert batch == 2
        assert uninterrupted == resumed
    metadata = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    (key,) = [k for k in metadata if k.startswith("state.model.") and k.endswith(C_ATTN)]
    chunks = sorted((tuple(c.offsets), tuple(c.sizes)) for c in metadata[key].chunks)
    assert chunks == [((row, 16 * i), (16, 16)) for row in (0, 16) for i in range(6)]


def _save_one_batch(rank, world, folder):
    trainer = _tensor_parallel(rank, world, batches=1, optimizer="sgd")
    trainer.fit()
    save_checkpoint(trainer.state, folder).wait()


def test_tensor_parallel_checkpoint_loads_into_one_process(tmp_path):
    import_transformers()
    folder = tmp_path / "ba1"
    run_ranks(_save_one_batch, 2, str(folder))
    # SGD: AdamW would turn the float noise in the gradient of GPT-2's key bias (zero in
    # exact arithmetic) into steps of the full learning rate, different in each layout.
    reference = make_trainer(None, 0, 1, model=gpt2, batches=1, optimizer="sgd")
    reference.fit()
    single = make_trainer(None, 0, 1, model=gpt2, batches=1, optimizer="sgd")
    load_checkpoint(single.state, folder, weights_only=True)
    loaded = dict(single.state.model.named_parameters())
    trained = dict(reference.state.model.named_parameters())
    assert not torch.equal(
        loaded[f"model.transformer.{C_ATTN}"], gpt2().model.transformer.h[0].attn.c_attn.weight
    )
    for name, value in trained.items():
        torch.testing.assert_close(loaded[name], value, rtol=0, atol=1e-5, msg=name)


def _export(rank, world, folder):
    export = ExportOnFitEnd(folder=folder, formats=["safetensors"])
    _tensor_parallel(rank, world, batches=1, optimizer="sgd", callbacks=[export]).fit()


def test_export_on_fit_end_gathers_the_fused_projection_whole(tmp_path):
    # Gathered block by block: torch 2.11's full_tensor() cannot gather a strided shard.
    import_transformers()
    run_ranks(_export, 2, str(tmp_path))
    reference = make_trainer(None, 0, 1, model=gpt2, batches=1, optimizer="sgd")
    reference.fit()
    trained = reference.state.model.state_dict()
    exported = load_file(tmp_path / "model.safetensors")
    assert f"transformer.{C_ATTN}" in exported
    for name, value in exported.items():
        torch.testing.assert_close(value, trained[f"model.{name}"], rtol=0, atol=1e-5, msg=name)
