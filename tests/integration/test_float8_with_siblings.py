"""Float8Training with the sibling packages: checkpoints (trainkit-checkpoint) and FSDP2
(trainkit-parallel). The algorithm's own tests are in tests/algorithms/test_float8_training.py."""

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader
from torchao.float8.float8_linear import Float8Linear

from algorithms.test_float8_training import make
from multirank import run_ranks
from parallel.helpers import Blocks, full_weights, max_difference, to_bytes
from toy import blobs, flat_params
from trainkit.algorithms import Float8Training
from trainkit.trainer import Trainer


def test_checkpoint_resume_continues_exactly(tmp_path):
    full = make(tmp_path)
    full.fit()
    first = make(tmp_path, save_folder=str(tmp_path / "run"), save_interval="2ba", autoresume=True)
    first.fit(duration="3ba")
    resumed = make(
        tmp_path, save_folder=str(tmp_path / "run"), save_interval="2ba", autoresume=True
    )
    assert resumed.state.timestamp.batch == 3
    assert isinstance(resumed.state.model.module[0], Float8Linear)
    resumed.fit()
    assert torch.equal(flat_params(resumed.state.model), flat_params(full.state.model))


def _fit_blocks(rank, world, sharded=True):
    """Float8 blocks trained in one process, or under FSDP2 with every rank reading the
    whole batch (so each rank's fp8 scales are the single process's)."""
    from trainkit.parallel import FSDP

    model = Blocks(features=16, width=64, depth=2)
    trainer = Trainer(
        model=model,
        train_dataloader=DataLoader(blobs(64, features=16, seed=1), batch_size=16),
        max_duration="4ba",
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        parallelism=FSDP() if sharded else None,
        algorithms=[Float8Training()],
        device="cpu",
        progress_bar=False,
        seed=7,
    )
    trainer.fit()
    assert isinstance(model.blocks[0].up, Float8Linear) and type(model.head) is nn.Linear
    assert isinstance(model.blocks[0].up.weight, DTensor) is sharded
    return to_bytes(full_weights(trainer.state.model))


def test_fsdp2_shards_the_float8_layers_and_trains_like_one_process():
    alone = _fit_blocks(0, 1, sharded=False)
    sharded = run_ranks(_fit_blocks, 2)[0]
    # Each rank holds half of every weight; the fp8 layers gather it whole and compute
    # what one process computes (the averaged gradients of identical batches are exact).
    assert max_difference(sharded, alone) < 1e-6
