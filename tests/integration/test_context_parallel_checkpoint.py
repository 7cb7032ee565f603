"""A checkpoint saved under FSDP over shard 2 x context 2 (4 ranks) loads in one process.

The parameters are sharded over the flattened ``shard_context`` mesh dim; the checkpoint
holds them in the unsharded layout, so one process without a strategy reads exactly the
weights the four ranks trained.
"""

import torch

from multirank import run_ranks
from parallel.helpers import (
    PartlyLabelled,
    from_bytes,
    full_weights,
    make_trainer,
    positionwise_lm,
    to_bytes,
)
from trainkit.checkpoint import load_checkpoint, save_checkpoint
from trainkit.parallel import FSDP, ContextParallel


def _train_and_save(rank, world, folder):
    strategy = FSDP(context_parallel=ContextParallel(degree=2))
    trainer = make_trainer(
        strategy, rank, world, context=2, model=positionwise_lm, data=PartlyLabelled(),
        batches=2, optimizer="sgd",
    )  # fmt: skip
    trainer.fit()
    mesh = trainer.state.model.model.layers[0].up.weight.device_mesh.mesh_dim_names
    save_checkpoint(trainer.state, folder).wait()
    return to_bytes(full_weights(trainer.state.model)), mesh


def test_checkpoint_of_shard_by_context_loads_bitwise_in_one_process(tmp_path):
    folder = tmp_path / "ba2"
    (trained, mesh), *_ = run_ranks(_train_and_save, 4, str(folder))
    assert mesh == ("shard_context",)
    single = make_trainer(None, 0, 1, model=positionwise_lm, data=PartlyLabelled())
    untrained = {name: p.detach().clone() for name, p in single.state.model.named_parameters()}
    load_checkpoint(single.state, folder, weights_only=True)
    loaded = dict(single.state.model.named_parameters())
    trained = from_bytes(trained)
    assert loaded.keys() == trained.keys()
    for name, value in trained.items():
        assert torch.equal(loaded[name], value), name
    assert any(not torch.equal(untrained[n], trained[n]) for n in trained)  # it trained
