"""Pipeline parallel on CUDA with NCCL (run with `uv run pytest -m gpu`; skipped without a GPU).

One rank on one GPU: a one-stage pipeline still runs torch's schedule, its stage and the
loss broadcast on NCCL, and must train as the same run without a strategy does.
"""

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from parallel.helpers import LossLog, Tokens, import_transformers, llama, stage_weights
from trainkit.core.dist import init_distributed
from trainkit.parallel import PipelineParallel
from trainkit.trainer import Trainer

pytestmark = pytest.mark.gpu


def _fit(strategy, precision):
    network, log = llama(), LossLog()
    trainer = Trainer(
        model=network,
        train_dataloader=DataLoader(Tokens(), batch_size=16, shuffle=False),
        max_duration="3ba",
        optimizers=torch.optim.AdamW(network.parameters(), lr=0.02),
        parallelism=strategy,
        device="cuda",
        precision=precision,
        device_train_microbatch_size=4,
        callbacks=[log],
        progress_bar=False,
        seed=7,
    )
    trainer.fit()
    return stage_weights(trainer.state.model), log.losses


@pytest.mark.parametrize("precision, tolerance", [("fp32", 1e-4), ("amp_bf16", 5e-2)])
def test_one_stage_pipeline_on_nccl_trains_like_no_strategy(precision, tolerance):
    import_transformers()
    assert not dist.is_initialized()
    reference = _fit(None, precision)
    assert init_distributed(backend="nccl", env={}, timeout=120)
    try:
        weights, losses = _fit(PipelineParallel(plan="llama"), precision)
    finally:
        dist.destroy_process_group()
    assert weights.keys() == reference[0].keys()
    far = max((weights[k].float() - reference[0][k].float()).abs().max().item() for k in weights)
    assert far < tolerance
    assert losses == pytest.approx(reference[1], abs=tolerance)
