"""DDP and FSDP2 on NCCL (run with `uv run pytest -m gpu`; skipped without a GPU).

One rank on the one GPU: the test process starts a one-rank NCCL group itself
(`init_distributed` with no launcher variables: a TCPStore on a port the OS picks, hosted
here), so nothing forks, and the strategies run their real NCCL collectives. Each run is
compared with the same training without a strategy.
"""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.utils.data import DataLoader

from parallel.helpers import Blocks, Tokens, full_weights, gpt2, max_difference
from toy import blobs
from trainkit.core import Callback
from trainkit.core.dist import init_distributed
from trainkit.parallel import DDP, FSDP
from trainkit.trainer import Trainer

pytestmark = pytest.mark.gpu


class Losses(Callback):
    def __init__(self):
        self.losses = []

    def after_train_batch(self, state, logger):
        self.losses.append(float(state.total_loss))


def fit(strategy, model=Blocks, precision="fp32", batches=4, device="cuda"):
    network = model()
    data = Tokens() if model is gpt2 else blobs(64, seed=1)
    losses = Losses()
    trainer = Trainer(
        model=network,
        train_dataloader=DataLoader(data, batch_size=16, shuffle=False),
        max_duration=f"{batches}ba",
        optimizers=torch.optim.AdamW(network.parameters(), lr=0.02),
        parallelism=strategy,
        device=device,
        precision=precision,
        callbacks=[losses],
        progress_bar=False,
        seed=7,
    )
    trainer.fit()
    unwrapped = trainer.state.parallelism.unwrap(trainer.state.model)
    return trainer, full_weights(unwrapped), losses.losses


@pytest.fixture
def nccl_group():
    """A one-rank NCCL group in this process, destroyed afterwards."""
    assert not dist.is_initialized()
    assert init_distributed(backend="nccl", env={}, timeout=120)
    try:
        assert dist.get_backend() == "nccl" and dist.get_world_size() == 1
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def reference():
    """The training without a strategy or group (before the group starts)."""
    assert not dist.is_initialized()
    return fit(None)


def test_ddp_on_nccl_matches_one_process(reference, nccl_group):
    trainer, weights, losses = fit(DDP())
    assert isinstance(trainer.state.model, torch.nn.parallel.DistributedDataParallel)
    assert max_difference(weights, reference[1]) < 1e-5
    torch.testing.assert_close(losses, reference[2], rtol=1e-5, atol=1e-6)


def test_fsdp2_on_nccl_matches_one_process(reference, nccl_group):
    trainer, weights, losses = fit(FSDP())
    model = trainer.state.model
    assert isinstance(model, FSDPModule) and all(isinstance(b, FSDPModule) for b in model.blocks)
    assert max_difference(weights, reference[1]) < 1e-5
    torch.testing.assert_close(losses, reference[2], rtol=1e-5, atol=1e-6)


def test_fsdp2_bf16_on_nccl_trains_gpt2_like_one_process():
    _, _, alone = fit(None, model=gpt2, precision="amp_bf16", batches=6)
    assert init_distributed(backend="nccl", env={}, timeout=120)
    try:
        trainer, _, sharded = fit(FSDP(), model=gpt2, precision="amp_bf16", batches=6)
        assert isinstance(trainer.state.model, FSDPModule)
    finally:
        dist.destroy_process_group()
    # FSDP computes in bf16 parameters (autocast alone keeps fp32 ones): loose agreement.
    torch.testing.assert_close(sharded, alone, rtol=5e-2, atol=5e-2)
    assert sharded[-1] < sharded[0]
